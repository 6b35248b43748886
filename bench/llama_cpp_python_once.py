"""One cold llama-cpp-python invocation: load the model on the GPU, complete one token, exit.

    python bench/llama_cpp_python_once.py MODEL.gguf PROMPT
"""

import sys

from llama_cpp import Llama

llm = Llama(model_path=sys.argv[1], n_gpu_layers=-1, n_ctx=512, verbose=False)
out = llm(sys.argv[2], max_tokens=1, temperature=0.0)
print(repr(out["choices"][0]["text"]))
print("LLAMA_CPP_PYTHON_OK")

"""One cold llama-cpp-python invocation: load the model on the GPU, complete N tokens (default
1), exit.

    python bench/llama_cpp_python_once.py MODEL.gguf PROMPT [N]
"""

import sys

from llama_cpp import Llama

n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
# a context as small as the job allows (its allocation is part of the cold start)
n_ctx = 512 if len(sys.argv[2]) < 1000 and n < 256 else 4096
llm = Llama(model_path=sys.argv[1], n_gpu_layers=-1, n_ctx=n_ctx, verbose=False)
out = llm(sys.argv[2], max_tokens=n, temperature=0.0)
print(repr(out["choices"][0]["text"]))
print("LLAMA_CPP_PYTHON_OK")

"""Reflex core: GGUF reader, tokenizer, plugin host, op backends, engine and CLI.

Importing this package is cheap on purpose (the cold path): nothing here imports numpy, gguf,
cuda or huggingface_hub. Those are imported by the modules that need them, when they need them.
"""

__version__ = "0.1.0"

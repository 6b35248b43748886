"""Test and benchmark helpers: tiny random GGUF model writer, llama.cpp oracle helpers.

These modules import numpy and gguf-py; nothing on the engine's cold path imports them.
"""

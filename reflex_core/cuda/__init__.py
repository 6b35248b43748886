"""CUDA support of the core: the checked driver wrapper, the AOT fatbin loader and launch helpers.

Everything lives in :mod:`reflex_core.cuda.driver` (cuda-bindings' driver API; no numpy, no
NVRTC). Importing this package imports nothing heavy: ``cuda.bindings`` is imported by the
driver module itself, and only when a function that needs it is first called.
"""

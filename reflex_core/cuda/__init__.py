"""CUDA support of the core (cuda-bindings' driver API; no numpy, no NVRTC), by concern:

* :mod:`.start` -- the process-wide CUDA start on a thread (standard library at import);
* :mod:`.early` -- its first step: cuInit and the primary context through ctypes;
* :mod:`.driver` -- cuda-bindings, error checking, the device and its context;
* :mod:`.manifest` -- what a package's build shipped (manifest.json, GPU coverage);
* :mod:`.modules` -- kernel modules: loading, ``Kernels.launch``, the kernels' size limits;
* :mod:`.memory` -- device memory (caching allocator), copies, events;
* :mod:`.upload` -- host buffers, page-locking, the cold-path weight upload;
* :mod:`.quant_ops` -- launchers of the weight kernels (cuda/quant.cu, cuda/quant_lowbit.cu);
* :mod:`.smoke` -- ``reflex smoke``.

Importing this package imports nothing heavy: ``cuda.bindings`` is imported by the driver
module, and only when a function that needs it is first called.
"""

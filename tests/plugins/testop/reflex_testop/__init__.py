"""A test-only Reflex plugin: architecture ``testgated`` (Qwen3's layout, every FFN output gated
by the sigmoid of the FFN input) whose gate is an op of the plugin's own, with a NumPy twin and a
CUDA kernel in this package. It proves that a plugin's kernels build, load at run time (on the
CUDA init thread, requested as soon as the file's plugin is known) and run."""

__version__ = "0.1.0"

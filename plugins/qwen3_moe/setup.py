"""Build hook: compile this plugin's cuda/*.cu (if any) into reflex_qwen3_moe/kernels/."""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE = "reflex_qwen3_moe"


def _reflex_build():
    """The core's build helper: from the source tree when building in-tree, else installed."""
    import importlib.util

    in_tree = HERE.parents[1] / "reflex_core" / "_build.py"
    if in_tree.exists():
        spec = importlib.util.spec_from_file_location("reflex_build", in_tree)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod, HERE.parents[1] / "cuda" / "include"
    from reflex_core import _build  # an installed core (build-system.requires reflex-infer)

    return _build, Path(_build.__file__).parent / "include"


class BuildPyWithKernels(build_py):
    def run(self):
        if list((HERE / "cuda").glob("*.cu")):
            build, include = _reflex_build()
            pkg = HERE / PACKAGE if self.editable_mode else Path(self.build_lib) / PACKAGE
            build.build_kernels(HERE / "cuda", pkg / "kernels", [include, HERE / "cuda"])
        super().run()


setup(cmdclass={"build_py": BuildPyWithKernels})

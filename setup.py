"""Build hook: compile cuda/*.cu into reflex_core/kernels/*.fatbin at build time (never at run time)."""
import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("reflex_build", ROOT / "reflex_core" / "_build.py")
reflex_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reflex_build)


class BuildPyWithKernels(build_py):
    def run(self):
        pkg = ROOT / "reflex_core" if self.editable_mode else Path(self.build_lib) / "reflex_core"
        include_src = ROOT / "cuda" / "include"
        reflex_build.build_kernels(ROOT / "cuda", pkg / "kernels", [include_src],
                                   log=lambda m: self.announce(m, level=2) or print(m))
        # Ship the shared device headers so out-of-tree plugins can compile against them.
        shutil.copytree(include_src, pkg / "include", dirs_exist_ok=True)
        super().run()


setup(cmdclass={"build_py": BuildPyWithKernels})

"""Build hook: compile this plugin's cuda/*.cu (if any) into reflex_deepseek_mla/kernels/ at build time."""
import importlib.util
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
IN_TREE = HERE.parents[1] / "reflex_core" / "_build.py"
if IN_TREE.exists():  # building inside the Reflex source tree
    _spec = importlib.util.spec_from_file_location("reflex_build", IN_TREE)
    build = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(build)
else:  # an out-of-tree plugin: the installed core (build-system.requires = ["reflex-infer"])
    from reflex_core import _build as build

setup(cmdclass=build.plugin_cmdclass(HERE, "reflex_deepseek_mla"))

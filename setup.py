"""Wheel build: the usual setuptools build plus the ahead-of-time HIP step (hip/build.py).

The metadata lives in pyproject.toml; this file only adds the step that compiles the gfx942
code object into the package and writes ``_build_info.py`` beside it, and records the commit
in an sdist.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent


def _hip_build():
    spec = importlib.util.spec_from_file_location("dsv41_hip_build", ROOT / "hip" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithHip(build_py):
    """build_py, then the gfx942 code object and build info into the built package."""

    def run(self):
        package_dir = Path(self.build_lib) / "dsv41_gfx942_plugin"
        # From an empty package folder: build_py only adds and updates files, so a module since
        # deleted or renamed in src/ would otherwise stay in build/lib (which `pip wheel .` and
        # tests/run.sh reuse) and ship in the wheel.
        shutil.rmtree(package_dir, ignore_errors=True)
        super().run()
        _hip_build().build_package(package_dir)


class SdistWithCommit(sdist):
    """sdist, recording the checkout's commit in ``hip/COMMIT``, so that a wheel built from the
    sdist (outside this checkout) records it too."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        hip = _hip_build()
        (Path(base_dir) / "hip" / hip.SDIST_COMMIT).write_text(hip._git_commit() + "\n")


setup(cmdclass={"build_py": BuildPyWithHip, "sdist": SdistWithCommit})

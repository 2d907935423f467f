"""Builds the `sluice` Python package: the pybind11 extension comes from the project's CMake
(target sluice_python, python/CMakeLists.txt); the pure-Python files from python/sluice/; the
data files (length presets, profiled cost tables) from data/.

CMake configures into build-py/ (next to build/, so ccache reuses objects other builds made)
with -DSLUICE_PYTHON=ON -DSLUICE_TORCH=OFF and no tests or benchmarks. Environment:
SLUICE_CMAKE_ARGS (extra configure arguments), SLUICE_BUILD_JOBS (default 2),
SLUICE_BUILD_DIR (default build-py).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build-py"), exist_ok=True)  # setup.cfg's egg_base


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(sluice [^)]*VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.join(ROOT, os.environ.get("SLUICE_BUILD_DIR", "build-py"))
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", ROOT, "-B", build, *generator,
                     "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DPython_EXECUTABLE={sys.executable}",
                     "-DSLUICE_PYTHON=ON", "-DSLUICE_TORCH=OFF", "-DSLUICE_BUILD_TESTS=OFF",
                     "-DSLUICE_BUILD_BENCH=OFF", "-DCMAKE_MODULE_LINKER_FLAGS=-s",
                     *shlex.split(os.environ.get("SLUICE_CMAKE_ARGS", ""))]
        subprocess.check_call(configure)
        jobs = os.environ.get("SLUICE_BUILD_JOBS", "2")
        subprocess.check_call(["cmake", "--build", build, "--target", "sluice_python",
                               "-j", jobs])
        built = os.path.join(build, "python", "sluice")
        so = [f for f in os.listdir(built) if f.startswith("_sluice") and f.endswith(".so")]
        if len(so) != 1:
            raise RuntimeError(f"{built}: expected one _sluice*.so, found {so}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(built, so[0]), dest)


def data_files():
    out = []
    for sub in ("lengths", "profiles"):
        for name in sorted(os.listdir(os.path.join(ROOT, "data", sub))):
            out.append(f"data/{sub}/{name}")
    return out


class BuildPy(__import__("setuptools.command.build_py", fromlist=["build_py"]).build_py):
    """Copies data/ into the package as sluice/data/ (found through SLUICE_DATA_DIR)."""

    def run(self):
        super().run()
        for rel in data_files():
            dest = os.path.join(self.build_lib, "sluice", rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, rel), dest)


setup(
    version=version(),
    packages=["sluice"],
    package_dir={"sluice": "python/sluice"},
    ext_modules=[Extension("sluice._sluice", sources=[])],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
    zip_safe=False,
)

"""Builds tf_sc_embedding: the TensorFlow custom-op library and the pybind11 core module.

The op library (`_sc_ops`) is compiled with TensorFlow's own compile and link flags and loaded at
import with `tf.load_op_library`; the TensorFlow version it was built against is recorded in
`_build_info.py` so a mismatched wheel is reported clearly instead of failing with missing symbols.
"""
import glob
import os
from concurrent.futures import ThreadPoolExecutor

import pybind11
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_SOURCES = sorted(glob.glob("cc/core/*.cc"))
# setuptools rebuilds an extension only when one of its sources or `depends` is newer than it: with
# the headers listed, editing only a header (an inline kernel template) rebuilds too.
HEADERS = sorted(glob.glob("cc/**/*.h", recursive=True))
# The oneCCL transport's kernels are compiled at first use against the oneCCL that the `oneccl`
# extra installs (pip installs extras after building this package); a wheel ships their sources.
ONECCL_SOURCES = ["cc/transport/oneccl_communicator.cc", "cc/transport/oneccl_communicator.h",
                  "cc/kernels/oneccl/oneccl_kernels.cc", "cc/kernels/status_to_tf.h",
                  "cc/core/status.h"]
with open(os.path.join(ROOT, "requirements-oneccl.txt")) as _pins:
    ONECCL_EXTRA = [line.strip() for line in _pins if line.strip() and not line.startswith("#")]
COMMON_FLAGS = ["-O3", "-Wno-deprecated-declarations", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden", "-Wno-sign-compare"]


def tensorflow_flags():
    import tensorflow as tf  # noqa: PLC0415 (only needed at build time)

    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


class BuildWithTensorFlow(build_ext):
    """Adds TensorFlow's flags to the op library, records the version, and builds in parallel."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        version, compile_flags, link_flags = tensorflow_flags()
        for ext in self.extensions:
            if ext.name.endswith("_sc_ops"):
                ext.extra_compile_args = COMMON_FLAGS + compile_flags
                ext.extra_link_args = link_flags
        info_path = os.path.join(self.build_lib, "tf_sc_embedding", "_build_info.py")
        os.makedirs(os.path.dirname(info_path), exist_ok=True)
        for path in {info_path, os.path.join(ROOT, "tf_sc_embedding", "_build_info.py")}:
            with open(path, "w") as f:
                f.write('"""Written by setup.py: the TensorFlow the op library was built against."""\n')
                f.write(f"TENSORFLOW_VERSION = {version!r}\n")
        self._compile_sources_in_parallel()
        super().build_extensions()

    def _compile_sources_in_parallel(self):
        """setuptools compiles one source at a time; the TF headers make each file slow."""
        compiler = self.compiler
        serial_compile = compiler.compile

        def parallel_compile(sources, *args, **kwargs):
            if len(sources) < 2:
                return serial_compile(sources, *args, **kwargs)
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                objects = pool.map(lambda src: serial_compile([src], *args, **kwargs), sources)
                return [obj for group in objects for obj in group]

        compiler.compile = parallel_compile


class BuildPyWithOnecclSources(build_py):
    """Copies the oneCCL transport's sources into the package (tf_sc_embedding/_oneccl_sources)."""

    def run(self):
        super().run()
        for source in ONECCL_SOURCES:
            target = os.path.join(self.build_lib, "tf_sc_embedding", "_oneccl_sources", source)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self.copy_file(os.path.join(ROOT, source), target)


setup(
    name="tf_sc_embedding",
    version="0.1.0",
    description="TPUEmbeddingV2-style sharded embeddings with SparseCore ops that run on CPU",
    packages=find_packages(include=["tf_sc_embedding", "tf_sc_embedding.*"]),
    # The type stub of the pybind11 module `_core` (its signatures for IDEs and type checkers).
    package_data={"tf_sc_embedding": ["_core.pyi"]},
    python_requires=">=3.10",
    install_requires=["tensorflow-cpu==2.21.0", "numpy", "absl-py"],
    # `pip install .[oneccl]`: the oneCCL transport between workers (docs/multi_worker.md).
    extras_require={"oneccl": ONECCL_EXTRA},
    ext_modules=[
        Extension(
            "tf_sc_embedding._sc_ops",
            sources=CORE_SOURCES + sorted(glob.glob("cc/ops/*.cc")) + sorted(glob.glob("cc/kernels/*.cc")),
            depends=HEADERS,
            include_dirs=[ROOT],
            language="c++",
        ),
        Extension(
            "tf_sc_embedding._core",
            sources=CORE_SOURCES + ["cc/python/core_pybind.cc"],
            depends=HEADERS,
            include_dirs=[ROOT, pybind11.get_include()],
            extra_compile_args=COMMON_FLAGS + ["-std=c++17"],
            language="c++",
        ),
    ],
    cmdclass={"build_ext": BuildWithTensorFlow, "build_py": BuildPyWithOnecclSources},
    zip_safe=False,
)

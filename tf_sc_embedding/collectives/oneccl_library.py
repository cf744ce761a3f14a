"""Finds the optional oneCCL installation and builds and loads the oneCCL transport's kernels.

`pip install .[oneccl]` installs Intel's wheels (oneccl-cpu with libccl, its headers in
oneccl-cpu-devel, and libfabric from impi-rt) next to TensorFlow. The ops are registered by the
main op library; their kernels (cc/kernels/oneccl, cc/transport) link against libccl, so they
are compiled here against the oneCCL actually installed, once, with TensorFlow's own flags
(the same compiler the package's build used), and cached: a wheel-time build cannot see the
extra, which pip installs after building this package. Concurrent processes (the workers of a
job) build under a file lock and load the same file.

The cache is TF_SC_EMBEDDING_CACHE, else $XDG_CACHE_HOME/tf_sc_embedding, else
~/.cache/tf_sc_embedding; the file's name is a hash of the sources, the compile command and the
oneCCL it links, so an upgrade of any of them builds anew.
"""
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import subprocess
import sysconfig

import tensorflow as tf
from absl import logging

INSTALL_HINT = ("install the extra with `pip install .[oneccl]` (oneccl-cpu, oneccl-cpu-devel "
                "and impi-rt 2021.14)")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SOURCES = ("cc/transport/oneccl_communicator.cc", "cc/kernels/oneccl/oneccl_kernels.cc")
_HEADERS = ("cc/transport/oneccl_communicator.h", "cc/core/status.h",
            "cc/kernels/status_to_tf.h")


class Installation:
    """Where the oneCCL wheels put libccl, its headers and libfabric."""

    def __init__(self, library, include, fabric, providers):
        self.library = library        # .../lib/libccl.so
        self.include = include        # .../include (holds oneapi/ccl.hpp)
        self.fabric = fabric          # .../lib/libfabric/libfabric.so
        self.providers = providers    # .../lib/libfabric/prov


def _installed_file(distribution, suffix):
    """The installed path ending in `suffix` of a distribution's files (wheels install libraries
    and headers outside site-packages, e.g. ../../libccl.so relative to it), or None."""
    try:
        found = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in found.files or []:
        path = os.path.normpath(str(found.locate_file(f)))
        if path.replace(os.sep, "/").endswith(suffix) and os.path.exists(path):
            return path
    return None


@functools.lru_cache(maxsize=None)
def installation():
    """The Installation, or None when the extra (any of its three wheels) is missing."""
    library = _installed_file("oneccl-cpu", "lib/libccl.so")
    header = _installed_file("oneccl-cpu-devel", "include/oneapi/ccl.hpp")
    fabric = _installed_file("impi-rt", "lib/libfabric/libfabric.so")
    if not (library and header and fabric):
        return None
    return Installation(library, os.path.dirname(os.path.dirname(header)), fabric,
                        os.path.join(os.path.dirname(fabric), "prov"))


def is_installed():
    return installation() is not None


def require_installed():
    """Raises ValueError (a configuration error, at construction) without the extra."""
    if not is_installed():
        raise ValueError("exchange_transport='oneccl' needs oneCCL, which is not installed: " +
                         INSTALL_HINT)


def _source_root():
    """The folder holding cc/: the repository (editable install) or the copy setup.py ships."""
    for root in (os.path.join(_PACKAGE, "_oneccl_sources"), os.path.dirname(_PACKAGE)):
        if all(os.path.exists(os.path.join(root, f)) for f in _SOURCES + _HEADERS):
            return root
    raise ImportError("the oneCCL transport's sources are missing from this installation of "
                      "tf_sc_embedding; reinstall it with `pip install .[oneccl]`")


def _cache_dir():
    explicit = os.environ.get("TF_SC_EMBEDDING_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf_sc_embedding")


def _command(found, root, output):
    compiler = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    lib_dir = os.path.dirname(found.library)
    return (compiler.split() + ["-shared", "-fPIC", "-O2", "-std=c++17",
                                "-Wno-deprecated-declarations"] +
            tf.sysconfig.get_compile_flags() + ["-I" + root, "-I" + found.include] +
            [os.path.join(root, s) for s in _SOURCES] + ["-o", output] +
            tf.sysconfig.get_link_flags() +
            ["-L" + lib_dir, "-lccl", "-Wl,-rpath," + lib_dir])


def library_path():
    """The built kernel library (building it first if needed); raises ImportError without the
    extra or when the build fails."""
    found = installation()
    if found is None:
        raise ImportError(f"the oneCCL transport is not installed: {INSTALL_HINT}")
    root = _source_root()
    digest = hashlib.sha256()
    for part in _command(found, root, "OUT"):
        digest.update(part.encode() + b"\0")
    digest.update(str(os.path.getsize(found.library)).encode())
    for f in _SOURCES + _HEADERS:
        with open(os.path.join(root, f), "rb") as source:
            digest.update(source.read())
    cache = _cache_dir()
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, f"oneccl_kernels_{digest.hexdigest()[:16]}.so")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # one process builds, the others wait and load it
        if not os.path.exists(path):
            logging.info("building the oneCCL transport's kernels into %s (once)", path)
            partial = f"{path}.{os.getpid()}.tmp"
            result = subprocess.run(_command(found, root, partial), capture_output=True,
                                    text=True, check=False)
            if result.returncode != 0:
                raise ImportError("building the oneCCL transport's kernels failed:\n" +
                                  result.stderr[-4000:])
            os.replace(partial, path)
    return path


@functools.lru_cache(maxsize=None)
def load():
    """Loads the kernels once per process (after oneccl.apply_settings: oneCCL reads its
    environment when it starts) and returns the op library whose wrappers run them (the ops are
    registered there, cc/ops/oneccl_ops.cc)."""
    from tf_sc_embedding._library import library  # pylint: disable=import-outside-toplevel
    tf.load_op_library(library_path())
    return library

"""Loads the compiled op library once and checks it matches the installed TensorFlow."""
import glob
import os

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))


def _check_tensorflow_version():
    try:
        from tf_sc_embedding._build_info import TENSORFLOW_VERSION
    except ImportError as e:
        raise ImportError(
            "tf_sc_embedding's op library has not been built; install the package with "
            "`pip install .` from the repository root") from e
    if TENSORFLOW_VERSION != tf.__version__:
        raise ImportError(
            f"tf_sc_embedding was built against TensorFlow {TENSORFLOW_VERSION} but TensorFlow "
            f"{tf.__version__} is installed; custom ops are not ABI-compatible across releases. "
            f"Reinstall tf_sc_embedding (pip install --force-reinstall .) or install "
            f"TensorFlow {TENSORFLOW_VERSION}.")


def _load():
    _check_tensorflow_version()
    candidates = sorted(glob.glob(os.path.join(_HERE, "_sc_ops*.so")))
    if not candidates:
        raise ImportError(f"the op library _sc_ops*.so was not found in {_HERE}; "
                          "reinstall tf_sc_embedding with `pip install .`")
    return tf.load_op_library(candidates[0])


library = _load()

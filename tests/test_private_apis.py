"""Private TensorFlow and Keras APIs are used in one place each: only `tf_sc_embedding/private_tf.py`
imports `tensorflow.python`, only `tf_sc_embedding/keras_compat.py` imports `keras.src` (in the
library, its tests, benchmarks and examples), and the docstring of each names every private module
it imports. Only import statements count (at any indentation), not mentions in text."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("tf_sc_embedding", "tests", "bench", "examples")
PRIVATE = {"tensorflow.python": "tf_sc_embedding/private_tf.py",
           "keras.src": "tf_sc_embedding/keras_compat.py"}


def python_files():
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


def imported_modules(source, filename="<source>"):
    """(line, dotted name) of every module an import statement in `source` imports;
    `from a.b import c` gives a.b.c (c may be a module)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def private_prefix(module):
    for prefix in PRIVATE:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def violations():
    found = []
    for relpath, path in python_files():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for line, module in imported_modules(source, relpath):
            prefix = private_prefix(module)
            if prefix is not None and PRIVATE[prefix] != relpath:
                found.append(f"{relpath}:{line}: imports {module} (only {PRIVATE[prefix]} may)")
    return found


def test_the_scan_sees_imports_not_mentions():
    source = '''"""Docstring: from tensorflow.python.util import nest"""
import tensorflow as tf
from tensorflow import python
import keras.src.tree as t
x = "import keras.src"  # import tensorflow.python.ops


def f():
    try:
        from tensorflow.python.ops import resource_variable_ops
    except ImportError:
        pass
from . import private_tf
'''
    private = [(line, m) for line, m in imported_modules(source) if private_prefix(m)]
    assert private == [(3, "tensorflow.python"), (4, "keras.src.tree"),
                       (10, "tensorflow.python.ops.resource_variable_ops")]


def test_only_private_tf_and_keras_compat_import_private_apis():
    assert [top for top in SCANNED[:2] if not os.path.isdir(os.path.join(ROOT, top))] == []
    found = violations()
    assert not found, "private API imported outside its module:\n" + "\n".join(found)


def test_their_docstrings_name_every_private_module_they_import():
    for prefix, relpath in PRIVATE.items():
        with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
            source = f.read()
        doc = ast.get_docstring(ast.parse(source)) or ""
        modules = [m for _, m in imported_modules(source) if private_prefix(m) == prefix]
        assert modules, f"{relpath} imports nothing from {prefix}: is it still needed?"
        missing = [m for m in modules if m not in doc]
        assert not missing, f"{relpath}'s docstring does not say why it imports {missing}"

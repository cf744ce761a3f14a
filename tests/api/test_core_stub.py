"""tf_sc_embedding/_core.pyi describes the pybind11 module `_core` as built: the same public names,
the same class members, the constants with int values, and setup.py ships the stub."""
import ast
import pathlib

from tf_sc_embedding import _core

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB = ROOT / "tf_sc_embedding" / "_core.pyi"


def _stub():
    return ast.parse(STUB.read_text(encoding="utf-8"))


def _public(names):
    return {n for n in names if not n.startswith("_")}


def _stub_names(body):
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return _public(names)


def test_stub_names_match_the_module():
    module_names = _public(dir(_core))
    assert _stub_names(_stub().body) == module_names


def test_stub_class_members_match_the_module():
    for node in _stub().body:
        if isinstance(node, ast.ClassDef):
            built = _public(dir(getattr(_core, node.name))) - {"__init__"}
            assert _stub_names(node.body) - {"__init__"} == built, node.name


def test_stub_constants_are_ints():
    for node in _stub().body:
        if isinstance(node, ast.AnnAssign):
            assert isinstance(getattr(_core, node.target.id), int), node.target.id


def test_setup_ships_the_stub():
    assert '"_core.pyi"' in (ROOT / "setup.py").read_text(encoding="utf-8")

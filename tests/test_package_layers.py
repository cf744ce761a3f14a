"""The package's folders are its architecture (docs/architecture.md#folders): each subpackage is one
layer of the data flow, and a module imports only from its own layer or the layers below it. So
nothing below the facade imports `embedding` or the Keras layer, Keras sits on top, and the top
level holds only the public entry points. Only import statements count, as in
test_private_apis.py (whose scan this reuses)."""
import os

from tests.test_private_apis import ROOT, imported_modules

PACKAGE = "tf_sc_embedding"
# Bottom to top. A name is a top-level module or a subpackage of tf_sc_embedding.
LAYERS = (
    ("_build_info", "_core", "_library", "private_tf", "data"),
    ("ops",),
    ("optimizers",),
    ("tables",),
    ("preprocessing",),
    ("collectives",),
    ("exchanges",),
    ("step",),
    ("deltas",),
    ("saving",),
    ("options",),
    ("embedding",),
    ("keras_compat", "keras"),
    ("__init__", "examples"),
)
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
# The public entry points and the private-API quarantines: everything else lives in a subpackage.
TOP_LEVEL_MODULES = {"__init__", "embedding", "options", "_library", "private_tf",
                     "keras_compat"}


def package_modules():
    """(unit, relative path, source) of every module of the package; unit is the top-level
    module or subpackage it belongs to."""
    top = os.path.join(ROOT, PACKAGE)
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py") or name == "_build_info.py":
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, top).replace(os.sep, "/")
            unit = relative.split("/")[0].removesuffix(".py")
            with open(path, encoding="utf-8") as f:
                yield unit, f"{PACKAGE}/{relative}", f.read()


def unit_of(module):
    """The layer unit a dotted module name of the package belongs to (None outside it); a name
    that is not a module or subpackage (`from tf_sc_embedding import TPUEmbeddingV2`) is the
    package's `__init__`."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYER_OF else "__init__"


def test_every_module_belongs_to_a_layer():
    units = {unit for unit, _, _ in package_modules()}
    assert units - set(LAYER_OF) == set(), "a new subpackage needs its place in LAYERS"


def test_the_top_level_holds_only_the_entry_points():
    top = os.path.join(ROOT, PACKAGE)
    modules = {n.removesuffix(".py") for n in os.listdir(top)
               if n.endswith(".py") and n != "_build_info.py"}
    assert modules == TOP_LEVEL_MODULES
    assert len(modules) <= 8


def test_imports_point_down_the_layers():
    found = []
    for unit, relpath, source in package_modules():
        for line, module in imported_modules(source, relpath):
            target = unit_of(module)
            if target is None or target == unit:
                continue
            if LAYER_OF[target] > LAYER_OF[unit]:
                found.append(f"{relpath}:{line}: {unit} (layer {LAYER_OF[unit]}) imports "
                             f"{module} (layer {LAYER_OF[target]})")
    assert not found, "imports that point up the layers:\n" + "\n".join(found)


def test_the_scan_sees_an_upward_import():
    source = "from tf_sc_embedding.keras import layer\nimport tf_sc_embedding.embedding\n"
    targets = [unit_of(m) for _, m in imported_modules(source)]
    assert targets == ["keras", "embedding"]
    assert all(LAYER_OF[t] > LAYER_OF["step"] for t in targets)

import ast
from pathlib import Path

import confide._native as native

STUB = Path(native.__file__).with_name("_native.pyi")


def test_stub_declares_exactly_the_native_api():
    """python/confide/_native.pyi lists every public name of the compiled module, no more."""
    tree = ast.parse(STUB.read_text())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    module_names = {name for name in dir(native) if not name.startswith("_")}
    assert functions | set(classes) | {"GMP_VERSION"} == module_names
    for name, node in classes.items():
        declared = {
            item.target.id if isinstance(item, ast.AnnAssign) else item.name
            for item in node.body
            if isinstance(item, (ast.AnnAssign, ast.FunctionDef))
        }
        actual = {attr for attr in dir(getattr(native, name)) if not attr.startswith("_")}
        # Dunder methods (constructors, __len__) are declared for type checkers; dir() shows them too.
        assert {d for d in declared if not d.startswith("_")} == actual, name

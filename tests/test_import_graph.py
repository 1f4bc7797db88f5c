"""The code's map holds: no import circle and no import up a layer, counting the imports made
inside functions and under ``TYPE_CHECKING`` (a deferred import still ties two modules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The installed names of the folders (pyproject.toml's package-dir).
PACKAGES = {"rm_qdrant": "rm_qdrant", "train": "rm_qdrant_train", "exporters": "rm_qdrant_exporters"}
#: Bottom to top: a module imports its own layer and those below, never one above.
LAYERS = [
    ("rm_qdrant.errors", "rm_qdrant.caches", "rm_qdrant.core"),
    ("rm_qdrant.store", "rm_qdrant.sources", "rm_qdrant.models"),
    ("rm_qdrant.pair",),
    ("rm_qdrant.serving",),
    ("rm_qdrant.monitoring",),
    ("rm_qdrant.migration",),
    ("rm_qdrant.operations",),
    ("rm_qdrant.evaluation",),
    ("rm_qdrant.api",),
    ("rm_qdrant.cli", "rm_qdrant.__main__", "rm_qdrant"),
    ("rm_qdrant_train", "rm_qdrant_exporters"),
]


def modules() -> dict[str, Path]:
    found = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, bool]:
    """The project's modules ``name`` imports, each with whether at the top (not in a function)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(f)
    }
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found[target] = found.get(target, False) or id(node) not in inside
    return found


def graph() -> dict[str, dict[str, bool]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(name: str) -> int:
    best = [
        (len(prefix), rank)
        for rank, group in enumerate(LAYERS)
        for prefix in group
        if name == prefix or name.startswith(prefix + ".")
    ]
    assert best, f"{name} is in no layer: add it to LAYERS"
    return max(best)[1]


def circles(edges: dict[str, dict[str, bool]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


@pytest.mark.slow
def test_no_module_imports_another_that_imports_it_back():
    assert circles(graph()) == []


@pytest.mark.slow
def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})"
        for name, targets in graph().items()
        for target in targets
        if layer(target) > layer(name)
        # the CLI, and the library call a command runs (rm_qdrant.fit), load the training and export
        # code when they train (it needs torch)
        and not (
            name.startswith(("rm_qdrant.cli", "rm_qdrant.api"))
            and layer(target) == len(LAYERS) - 1
            and not targets[target]
        )
    ]
    assert upward == []


def test_the_runtime_never_loads_training_code_at_import():
    top = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.startswith("rm_qdrant.") or name == "rm_qdrant"
        for target, at_top in targets.items()
        if at_top and target.startswith(("rm_qdrant_train", "rm_qdrant_exporters"))
    ]
    assert top == []


def test_the_checker_sees_a_deferred_circle_and_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a circle closed by an import inside a function, and a store module
    importing serving code, are both found."""
    for rel, text in {
        "rm_qdrant/__init__.py": "",
        "rm_qdrant/store/__init__.py": "",
        "rm_qdrant/store/a.py": "def f():\n    from rm_qdrant.serving import b\n",
        "rm_qdrant/serving/__init__.py": "",
        "rm_qdrant/serving/b.py": "from rm_qdrant.store.a import f\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    edges = graph()
    assert circles(edges) == [["rm_qdrant.serving.b", "rm_qdrant.store.a"]]
    assert (
        layer("rm_qdrant.serving.b") > layer("rm_qdrant.store.a")
        and "rm_qdrant.serving.b" in edges["rm_qdrant.store.a"]
    )


def test_every_error_is_one_tree_exported_at_the_top():
    """A user catches rm_qdrant.RmqError, or any kind of it, by its top-level name."""
    import inspect

    import rm_qdrant
    from rm_qdrant import errors

    kinds = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert {c.__name__ for c in kinds} <= set(rm_qdrant.__all__)
    assert all(issubclass(c, rm_qdrant.RmqError) and getattr(rm_qdrant, c.__name__) is c for c in kinds)
    names = [
        node.name
        for path in modules().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(getattr(b, "id", "").endswith(("Error", "Exception")) for b in node.bases)
    ]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []

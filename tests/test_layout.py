"""The package's layout holds: the rooms the docs promise import each other one way only.

Read from the source (every ``import``, at the top or inside a function), not from what happens
to be imported at run time, so a lazy import that closes a circle is caught too."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "goodput"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    where = PKG.parent.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _imports(path: Path, mod: str | None = None) -> set[str]:
    """The goodput modules ``path`` (module ``mod``) imports; ``from X import name`` counts X.name too."""
    mod = mod or _module(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_bytes(), str(path))
    typing_only = {  # `if TYPE_CHECKING:` imports run under a type checker only: no loop at run time
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # "from . import s3" imports the module s3, not its package's body
                sub = f"{target}.{a.name}"
                out.add(sub if _is_module(sub) else target)
    return {m for m in out if m == "goodput" or m.startswith("goodput.")}


def _graph(root: str) -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        if mod == root or mod.startswith(root + "."):
            graph[mod] = {m for m in _imports(path) if m in files and m != mod}
    return graph


def _cycles(graph: dict[str, set[str]], root: str) -> list[list[str]]:
    """The modules of an import loop inside ``root`` (graphlib names the first it meets), sorted;
    [] when there is none. The package's own ``__init__`` is left out: it hands its children's
    names on, and importing a child runs it first, which is no loop of the code's own."""
    inside = {m: {d for d in deps if d in graph and d != root} for m, deps in graph.items() if m != root}
    try:
        graphlib.TopologicalSorter(inside).prepare()
    except graphlib.CycleError as e:
        return [sorted(set(e.args[1]))]
    return []


@pytest.mark.parametrize("root", ["goodput.ckpt", "goodput.plan", "goodput.sched.core"])
def test_no_module_imports_itself_through_others(root: str) -> None:
    assert _cycles(_graph(root), root) == []


def test_the_cycle_finder_sees_a_lazy_import(tmp_path: Path) -> None:
    graph = {"r": {"r.a"}, "r.a": {"r.b"}, "r.b": {"r.c"}, "r.c": {"r.a"}, "r.d": {"r.a"}}
    assert _cycles(graph, "r") == [["r.a", "r.b", "r.c"]]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .x import y\n    import goodput.plan.units\n")
    # a function-local import is an arrow like any other, relative ones resolved from the module
    got = _imports(src, "goodput.ckpt.m")
    assert {"goodput.plan.units", "goodput.ckpt.x"} <= got


@pytest.mark.parametrize("root", ["goodput.ckpt", "goodput.sched"])
def test_no_module_imports_its_packages_face(root: str) -> None:
    """``goodput/ckpt/__init__.py`` hands its names on lazily (``_LAZY``, by string, which no
    parser follows): a module under it that imported ``goodput.ckpt`` itself would close a loop
    through those strings that the test above cannot see."""
    bad = {m: sorted(d for d in deps if d == root) for m, deps in _graph(root).items() if m != root}
    assert {m: d for m, d in bad.items() if d} == {}


@pytest.mark.parametrize(
    ("room", "never"),
    [
        ("goodput.ckpt", "goodput.sched"),  # the checkpoint library knows nothing of the scheduler
        ("goodput.plan", "goodput.sched"),  # plan is pure arithmetic
        ("goodput.plan", "goodput.ckpt"),
        ("goodput.sched", "goodput.demo"),  # the example jobs live with the demo, not the scheduler
    ],
)
def test_rooms_import_one_way(room: str, never: str) -> None:
    bad = {m: sorted(d for d in deps if d == never or d.startswith(never + ".")) for m, deps in _graph(room).items()}
    assert {m: d for m, d in bad.items() if d} == {}

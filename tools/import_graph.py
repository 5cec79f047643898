"""Count dpfl's import graph: modules, arrows, circles and arrows that climb.

Usage::

    python tools/import_graph.py            # the summary
    python tools/import_graph.py --list     # every circle and climbing arrow
    python tools/import_graph.py --rooms    # the same between top-level packages

Every ``import``/``from ... import`` of a ``dpfl`` module in ``src/dpfl`` is
an arrow, wherever it stands (module level, inside a function, or under
``TYPE_CHECKING``: a lazy import is still a dependency). Circles are the
strongly connected components of more than one module; a two-module circle
is listed as such (often a benign alternate constructor). An arrow that
stands only under ``if TYPE_CHECKING:`` is *type-only*: it names a type for
the checker and runs nothing, so the circles are also counted without those
arrows ("at run time"). A module's layer is
the first entry of :data:`LAYERS` that its dotted name starts with; an arrow
from a lower layer to a higher one "climbs".
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"

#: Layers from the ground up; a module belongs to the first prefix it matches.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground",
        (
            "dpfl.errors",
            "dpfl._validate",
            "dpfl._files",
            "dpfl._runtime",
            "dpfl._deadline",
        ),
    ),
    ("accounting", ("dpfl.accounting",)),
    ("data", ("dpfl.data", "dpfl.models")),
    ("engine", ("dpfl.sim",)),
    ("figures", ("dpfl.plotting",)),
    ("audit", ("dpfl.audit",)),
    ("assembly", ("dpfl.experiments", "dpfl.api")),
    ("papers", ("dpfl.papers",)),
    ("integrations", ("dpfl.integrations",)),
    ("face", ("dpfl.cli", "dpfl.__main__")),
    ("package", ("dpfl",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer(name: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    return len(LAYERS)


def _type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is ``TYPE_CHECKING`` (or ``typing.TYPE_CHECKING``)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def imports(path: Path, name: str, known: set[str]) -> dict[str, bool]:
    """The dpfl modules ``name`` imports, each with whether it is type-only."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, bool] = {}

    def visit(node: ast.AST, typing_only: bool) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            # the longest known module that the target names
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("dpfl"):
                out[t] = out.get(t, True) and typing_only
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(tree, False)
    return out


def graph(rooms: bool = False) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every arrow, and the arrows that run at import or call time.

    With ``rooms``, modules are merged into their top-level package
    (``dpfl.sim.loop`` into ``dpfl.sim``) and arrows inside one room dropped.
    """
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    found = {n: imports(p, n, known) for n, p in files.items()}
    # importing a package's submodule also runs the package's __init__: not an
    # arrow of the importer's design, so the package itself is dropped as a
    # target when a submodule of it is imported
    for n, targets in found.items():
        found[n] = {
            t: k
            for t, k in targets.items()
            if not any(u.startswith(t + ".") for u in targets)
        }
    if rooms:
        merged: dict[str, dict[str, bool]] = {}
        for n, targets in found.items():
            a = room(n)
            into = merged.setdefault(a, {})
            for t, k in targets.items():
                b = room(t)
                if b != a:
                    into[b] = into.get(b, True) and k
        found = merged
    every = {n: set(t) for n, t in found.items()}
    runtime = {n: {t for t, k in ts.items() if not k} for n, ts in found.items()}
    return every, runtime


def room(name: str) -> str:
    """A module's top-level package (a top-level module is its own room)."""
    return ".".join(name.split(".")[:2])


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def climbs(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (a, b)
        for a, targets in edges.items()
        for b in targets
        if layer(b) > layer(a) and not a.startswith(b + ".") and b != "dpfl"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list circles and climbs")
    ap.add_argument("--rooms", action="store_true", help="between top-level packages")
    args = ap.parse_args(argv)
    edges, runtime = graph(rooms=args.rooms)
    circ = circles(edges)
    circ_run = circles(runtime)
    up = climbs(edges)
    sizes = sorted(
        ((sum(1 for _ in p.open()), module_name(p)) for p in ROOT.rglob("*.py")),
        reverse=True,
    )
    flags = (" --list" if args.list else "") + (" --rooms" if args.rooms else "")
    what = "rooms" if args.rooms else "modules"
    print("command: python tools/import_graph.py" + flags)
    typed = sum(map(len, edges.values())) - sum(map(len, runtime.values()))
    print(
        f"{what} {len(edges)}, arrows {sum(map(len, edges.values()))} "
        f"({typed} type-only)"
    )
    print(
        f"circles {len(circ)} (two-{what[:-1]} {sum(len(c) == 2 for c in circ)}, "
        f"larger {sum(len(c) > 2 for c in circ)}); at run time {len(circ_run)} "
        f"(two-{what[:-1]} {sum(len(c) == 2 for c in circ_run)}, "
        f"larger {sum(len(c) > 2 for c in circ_run)}); "
        f"arrows climbing a layer {len(up)}"
    )
    print(f"largest module: {sizes[0][1]} ({sizes[0][0]} lines)")
    print(f"modules over 700 lines: {sum(n > 700 for n, _ in sizes)}")
    if args.list:
        for c in circ:
            kind = "" if c in circ_run else " (type-only)"
            print(f"circle{kind}:", " <-> ".join(c))
        for a, b in up:
            print(f"climbs: {a} -> {b}")
        for n, m in sizes[:15]:
            print(f"{n:6d}  {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

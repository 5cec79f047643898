"""Count dpfl's import graph: modules, arrows, circles and arrows that climb.

Usage::

    python tools/import_graph.py            # the summary
    python tools/import_graph.py --list     # every circle and climbing arrow

Every ``import``/``from ... import`` of a ``dpfl`` module in ``src/dpfl`` is
an arrow, wherever it stands (module level, inside a function, or under
``TYPE_CHECKING``: a lazy import is still a dependency). Circles are the
strongly connected components of more than one module; a two-module circle
is listed as such (often a benign alternate constructor). A module's layer is
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
    ("ground", ("dpfl.errors", "dpfl._validate", "dpfl._files", "dpfl._runtime")),
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


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
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
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    edges = {n: imports(p, n, known) for n, p in files.items()}
    # importing a package's submodule also runs the package's __init__: not an
    # arrow of the importer's design, so the package itself is dropped as a
    # target when a submodule of it is imported
    for n, targets in edges.items():
        edges[n] = {
            t for t in targets if not any(u.startswith(t + ".") for u in targets)
        }
    return edges


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
    args = ap.parse_args(argv)
    edges = graph()
    circ = circles(edges)
    up = climbs(edges)
    sizes = sorted(
        ((sum(1 for _ in p.open()), module_name(p)) for p in ROOT.rglob("*.py")),
        reverse=True,
    )
    print("command: python tools/import_graph.py" + (" --list" if args.list else ""))
    print(f"modules {len(edges)}, arrows {sum(map(len, edges.values()))}")
    print(
        f"circles {len(circ)} (two-module {sum(len(c) == 2 for c in circ)}, "
        f"larger {sum(len(c) > 2 for c in circ)}); arrows climbing a layer {len(up)}"
    )
    print(f"largest module: {sizes[0][1]} ({sizes[0][0]} lines)")
    print(f"modules over 700 lines: {sum(n > 700 for n, _ in sizes)}")
    if args.list:
        for c in circ:
            print("circle:", " <-> ".join(c))
        for a, b in up:
            print(f"climbs: {a} -> {b}")
        for n, m in sizes[:15]:
            print(f"{n:6d}  {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

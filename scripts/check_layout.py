"""Print the import graph's cycles and the largest files and classes of the product code.

    python scripts/check_layout.py            # report; exit 1 on a cycle or an oversized file
    python scripts/check_layout.py --top 20

Reads the sources with ``ast`` (nothing is imported or run). A module's imports are its
``import`` and ``from ... import`` statements at any depth, including the lazy ones inside
functions (a lazy import still ties the two modules); ``if TYPE_CHECKING:`` blocks are left
out, since they exist only for annotations. ``from pkg import name`` counts as importing
``pkg.name`` when that is a module, else ``pkg``. A package's ``__init__`` is a node of its
own.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "jobs", "reflow_cli")
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports_of(tree: ast.AST, here: str, is_package: bool, modules: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = here if is_package else here.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in modules else base)
            visit(child)

    visit(tree)
    return {m for m in found if m in modules}


def graph() -> tuple[dict[str, set[str]], dict[str, Path]]:
    files = {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((REPO / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    modules = set(files)
    edges = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges[name] = imports_of(tree, name, path.name == "__init__.py", modules) - {name}
    return edges, files


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def classes(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [
        (node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=10, help="how many of the largest to list")
    args = ap.parse_args(argv)
    edges, files = graph()
    found = cycles(edges)
    print(f"import cycles among {len(files)} modules of {', '.join(PACKAGES)}: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    sizes = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(REPO))) for p in files.values()),
        reverse=True,
    )
    print(f"\nthe {args.top} largest files (limit {MAX_FILE_LINES} lines):")
    for n, name in sizes[: args.top]:
        print(f"  {n:5d}  {name}{'  OVER' if n > MAX_FILE_LINES else ''}")
    big = sorted(
        ((n, f"{p.relative_to(REPO)}::{c}") for p in files.values() for c, n in classes(p)),
        reverse=True,
    )
    print(f"\nthe {args.top} largest classes (limit {MAX_CLASS_LINES} lines):")
    for n, name in big[: args.top]:
        print(f"  {n:5d}  {name}{'  OVER' if n > MAX_CLASS_LINES else ''}")
    over = [s for s in sizes if s[0] > MAX_FILE_LINES] + [b for b in big if b[0] > MAX_CLASS_LINES]
    return 1 if found or over else 0


if __name__ == "__main__":
    sys.exit(main())

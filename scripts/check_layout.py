"""Print the import graph's cycles, its imports of a higher layer, and the largest files
and classes of the product code.

    python scripts/check_layout.py            # report; exit 1 on a cycle, an upward
                                              # import or an oversized file
    python scripts/check_layout.py --top 20 [--root DIR]

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

# The layers, lowest first (docs/architecture.md draws them): a module may import its own
# layer and the ones below, never one above, lazily or not. A module's layer is that of
# its longest matching prefix; every module of the packages must have one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("runtime.checkpoint_layout",),  # how a MoE's experts are named in and out of the trainer
    ("runtime.embedded",),  # tiny models, warm starts, the arithmetic task
    ("runtime.config",),  # workload_kinds names each kind's agent loop as a string
    ("runtime.data",),
    ("runtime.transport",),
    ("runtime.store",),
    ("runtime.control",),  # rank 0's pure logic
    ("runtime.rank",),  # a rank's process: worker, sides, process groups, control server
    ("runtime.workloads.user_code",),
    ("runtime.workloads.sandbox",),
    ("runtime.workloads.rewards",),
    ("runtime.workloads.agents",),
    ("runtime.workloads",),
    ("runtime.weights",),
    ("runtime.engines.torch", "runtime.engines.vllm"),
    ("runtime.engines",),  # the registry: resolves the engines by name, the edge
    ("runtime.sim",),  # drives control with modelled engines
    ("runtime.entry",),
    ("jobs",),
    ("reflow_cli",),
)
UNLAYERED = {"runtime"}  # the bare package (a docstring)
# (importer, imported) -> why this upward import is allowed; none today. A stale entry is
# reported too, so the list cannot outlive its reason.
EDGES: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def import_sites(
    tree: ast.AST, here: str, is_package: bool, modules: set[str]
) -> list[tuple[str, int, bool]]:
    """(imported module, line, lazy) of each import of a module of ``modules``: its
    ``import`` and ``from ... import`` statements at any depth (lazy: inside a function
    or class), ``if TYPE_CHECKING:`` blocks left out."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other, lazy)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append((alias.name, child.lineno, lazy))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = here if is_package else here.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    found.append((sub if sub in modules else base, child.lineno, lazy))
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            visit(child, lazy or inner)

    visit(tree, False)
    return [x for x in found if x[0] in modules]


def imports_of(tree: ast.AST, here: str, is_package: bool, modules: set[str]) -> set[str]:
    return {m for m, _, _ in import_sites(tree, here, is_package, modules)}


def graph(
    root: Path = REPO,
) -> tuple[dict[str, set[str]], dict[str, Path], dict[str, list[tuple[str, int, bool]]]]:
    """Each module's imports, its file, and its import sites."""
    files = {
        module_name(p, root): p
        for pkg in PACKAGES
        for p in sorted((root / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    modules = set(files)
    edges, sites = {}, {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        sites[name] = [
            s for s in import_sites(tree, name, path.name == "__init__.py", modules) if s[0] != name
        ]
        edges[name] = {m for m, _, _ in sites[name]}
    return edges, files, sites


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the longest prefix that holds ``module``."""
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def upward(
    sites: dict[str, list[tuple[str, int, bool]]], files: dict[str, Path], root: Path = REPO
) -> list[str]:
    """Every import of a higher layer (``path:line -> module (lazy|top-level)``), every
    module without a layer, and every :data:`EDGES` entry no import uses."""
    out: list[str] = []
    used: set[tuple[str, str]] = set()
    for name in sorted(sites):
        if name in UNLAYERED:
            continue
        mine = layer_of(name)
        if mine is None:
            out.append(f"{files[name].relative_to(root)}: {name} is in no layer (LAYERS)")
            continue
        for module, line, lazy in sites[name]:
            theirs = layer_of(module)
            if theirs is None or theirs <= mine:
                continue
            if (name, module) in EDGES:
                used.add((name, module))
                continue
            how = "lazy" if lazy else "top-level"
            found = f"{files[name].relative_to(root)}:{line} -> {module} ({how})"
            if found not in out:  # one line per statement, however many names it takes
                out.append(found)
    out += [f"EDGES {a} -> {b}: no such import any more" for a, b in EDGES if (a, b) not in used]
    return out


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
    ap.add_argument("--root", type=Path, default=REPO, help="the checkout to check")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    edges, files, sites = graph(root)
    found = cycles(edges)
    print(f"import cycles among {len(files)} modules of {', '.join(PACKAGES)}: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    up = upward(sites, files, root)
    print(f"\nimports of a higher layer (LAYERS, lowest first): {len(up)}")
    for line in up:
        print(f"  {line}")
    sizes = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(root))) for p in files.values()),
        reverse=True,
    )
    print(f"\nthe {args.top} largest files (limit {MAX_FILE_LINES} lines):")
    for n, name in sizes[: args.top]:
        print(f"  {n:5d}  {name}{'  OVER' if n > MAX_FILE_LINES else ''}")
    big = sorted(
        ((n, f"{p.relative_to(root)}::{c}") for p in files.values() for c, n in classes(p)),
        reverse=True,
    )
    print(f"\nthe {args.top} largest classes (limit {MAX_CLASS_LINES} lines):")
    for n, name in big[: args.top]:
        print(f"  {n:5d}  {name}{'  OVER' if n > MAX_CLASS_LINES else ''}")
    over = [s for s in sizes if s[0] > MAX_FILE_LINES] + [b for b in big if b[0] > MAX_CLASS_LINES]
    return 1 if found or over or up else 0


if __name__ == "__main__":
    sys.exit(main())

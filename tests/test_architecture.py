"""The layers of src/recipetune and its import graph: no cycles, nothing imports upward.

LAYERS below is the one statement of the rule (docs/architecture.md draws it): a module may import
its own package and the packages of lower layers, never a peer package of its own layer (the jobs
never import each other) and never a higher one. A top-level module (``cli.py``, ``__init__.py``)
belongs to its layer with the packages beside it, so ``__main__`` may import ``cli``. Every import
counts, those inside functions too: a lazy import hides a dependency from the reader, it does not
remove it. Imports under ``if TYPE_CHECKING:`` count as well: they never run, but a reader follows
them the same way, and a cycle through one is a cycle in the design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "recipetune"

# bottom to top; a name is a package (a folder) or a top-level module of src/recipetune
LAYERS: list[tuple[str, list[str]]] = [
    ("foundations", ["core", "__init__"]),  # recipetune/__init__.py is foundations
    ("parts", ["trainer", "data"]),
    ("workloads", ["workloads", "integrations"]),
    ("execution", ["execute"]),
    ("control system and engine", ["guard", "engine"]),
    ("campaign file", ["config"]),  # recipetune/config.py: the run/tune/verify/cbs campaign file
    ("jobs", ["speed", "finetune", "cbs"]),  # peers: they never import each other
    ("surfaces", ["report", "bench", "view"]),  # view: the live table and the campaign commands
    ("command line", ["cli", "__main__"]),
]
LAYER_OF = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
# Peers are packages: a top-level module shares its layer with the packages beside it
# (__main__ runs cli; core.measure reads recipetune.__version__), two packages of a layer never import each other.
PACKAGES = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    """The table's name for a module: its package under recipetune, or the top-level module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(node: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, imported recipetune module) for every import under ``node``, TYPE_CHECKING blocks included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name.split(".")[0] == "recipetune":
                    yield child.lineno, alias.name
        elif isinstance(child, ast.ImportFrom):
            if child.level:  # relative: resolved against the importing module's package
                base = module.split(".")[: len(module.split(".")) - child.level + (1 if is_package else 0)]
                target = ".".join([*base, *([child.module] if child.module else [])])
            else:
                target = child.module or ""
            if target.split(".")[0] != "recipetune":
                continue
            for alias in child.names:  # `from recipetune.speed import job` imports recipetune.speed.job
                sub = f"{target}.{alias.name}"
                yield child.lineno, sub if sub in MODULES else target
        yield from _imports(child, module, is_package)


FILES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
MODULES = set(FILES)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, recipetune's own modules only."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in FILES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        edges: dict[str, int] = {}
        for line, target in _imports(tree, name, path.name == "__init__.py"):
            while target not in MODULES and "." in target:  # `import recipetune.a.b.attr` style
                target = target.rsplit(".", 1)[0]
            if target != name and target in MODULES:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


GRAPH = import_graph()


def _where(module: str, target: str) -> str:
    return f"{FILES[module].relative_to(SRC.parents[1])}:{GRAPH[module][target]} imports {target}"


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan), as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_cycle(graph, sorted(c)) for c in components]


def _a_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    inside, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return paths[v] + [start]
                if w in inside and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return component  # unreachable for a strongly connected component


def test_every_package_and_top_level_module_has_a_layer():
    units = {unit_of(m) for m in MODULES}
    missing = sorted(units - set(LAYER_OF))
    assert not missing, (f"{', '.join(missing)}: not in LAYERS (tests/test_architecture.py); place each new package "
                         "or top-level module in its layer there, and in docs/architecture.md")


def test_no_import_cycles():
    cycles = find_cycles(GRAPH)
    lines = []
    for cycle in cycles:
        lines.append(" -> ".join(cycle))
        lines += [f"    {_where(a, b)}" for a, b in zip(cycle, cycle[1:], strict=False)]
    assert not cycles, f"{len(cycles)} import cycle(s) (imports inside functions count):\n" + "\n".join(lines)


def test_imports_go_to_the_same_package_or_a_lower_layer():
    wrong = []
    for module, edges in sorted(GRAPH.items()):
        unit = unit_of(module)
        for target in sorted(edges):
            other = unit_of(target)
            if other == unit or other not in LAYER_OF or unit not in LAYER_OF:
                continue  # an unplaced unit is the test above's failure
            mine, theirs = LAYER_OF[unit], LAYER_OF[other]
            if theirs > mine:
                wrong.append(f"{_where(module, target)}: upward, {unit} ({LAYERS[mine][0]}) -> "
                             f"{other} ({LAYERS[theirs][0]})")
            elif theirs == mine and {unit, other} <= PACKAGES:
                wrong.append(f"{_where(module, target)}: a peer of its layer ({LAYERS[mine][0]}: {unit} -> {other})")
    assert not wrong, (f"{len(wrong)} import(s) against the layers (LAYERS, bottom to top: "
                       + " < ".join(name for name, _ in LAYERS) + "):\n" + "\n".join(wrong))


def test_the_graph_sees_lazy_and_relative_imports():
    # the checks above are only as good as the graph: a lazy import inside a function must be in it
    assert "recipetune.workloads.reference" in GRAPH["recipetune.config"]  # imported inside build_workload
    assert "recipetune.cli" in GRAPH["recipetune.__main__"]
    assert "recipetune.speed.control" in GRAPH["recipetune.speed.decide"]  # under `if TYPE_CHECKING:`

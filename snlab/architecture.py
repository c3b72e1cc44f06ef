"""How snlab is built: its layers, read from the code.

Each module belongs to a *room* (a top-level module or subpackage of ``snlab``), and
each room to a *layer*. Data flows one way: a module may import from its own layer and
from the layers below it, never from above, and the imports between rooms form no
cycle. :func:`violations` checks that from the source (every ``import``, at module
level or inside a function); :func:`mermaid` draws the rooms and their imports for the
README, so the diagram is the code's, not drawn by hand.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).parent

#: the layers, bottom first, each with its rooms and what a contributor puts there
LAYERS = (
    ("foundations", ("errors", "units", "symbols", "formula", "formula_cache", "files", "kernel"),
     "errors, unit conversion, the nomenclature, Formula and its compiled code on disk, whole-file writes, "
     "scalar kernels traced from the planners' chains"),
    ("walls", ("walls", "sizing"), "the four walls (and serving) as sympy formulas, one module each; a "
                                    "model's sizes from them"),
    ("presets", ("schema", "specs", "presets", "power_cooling"), "preset data, its schema, frozen objects; a "
                                                                 "system under a kind of cooling"),
    ("hardware and network", ("hardware", "topology", "network", "grid", "result", "uncertainty", "energy",
                              "energy_prices"),
     "a system's numbers, where a group sits on a torus or mesh, collectives over its levels, the planners' grid "
     "and result base, error bands, power and cost from the step models' columns"),
    ("planners", ("training", "serving", "exploration"),
     "rules, step model as named parts, planners, results; grids of any size explored in chunks"),
    ("evidence", ("validation", "claims", "compare", "codesign"),
     "published runs, the article's claims, comparisons, the fabric one would build"),
    ("lab", ("offline", "chart_data", "charts", "tables", "lessons", "widgets", "figures"),
     "charts, tables, the lessons' questions, dashboards, README figures"),
    ("interfaces", ("cli", "docs", "architecture", "__init__", "__main__"), "the snlab command, generated docs"),
)
ROOM_LAYER = {room: i for i, (_, rooms, _) in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str:
    """The room of a dotted module name inside snlab (``snlab.training.step`` -> ``training``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("snlab"):
        return []
    if node.module is None or node.level and not node.module:
        return [f"{target}.{a.name}" for a in node.names]
    return [target] + [f"{target}.{a.name}" for a in node.names]


@lru_cache(maxsize=1)
def imports() -> dict[str, set[str]]:
    """Every snlab module and the snlab modules (or names in them) it imports."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found: set[str] = set()
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("snlab")}
            elif isinstance(node, ast.ImportFrom):
                found |= set(_resolve(module, path.name == "__init__.py", node))
        out[module] = found
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (type-only imports, which
    never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def room_edges() -> set[tuple[str, str]]:
    """(room, room it imports from) for every import between different rooms."""
    edges = set()
    for module, targets in imports().items():
        for target in targets:
            a, b = room_of(module), room_of(target)
            if a != b and b in ROOM_LAYER:
                edges.add((a, b))
    return edges


def violations() -> list[str]:
    """Imports that go up a layer, rooms that belong to no layer, and cycles between rooms."""
    problems = [f"room {room!r} is in no layer of snlab.architecture.LAYERS"
                for room in sorted({room_of(m) for m in imports()}) if room not in ROOM_LAYER]
    edges = room_edges()
    problems += [f"{a} (layer {ROOM_LAYER[a]}) imports {b} (layer {ROOM_LAYER[b]})"
                 for a, b in sorted(edges) if a in ROOM_LAYER and ROOM_LAYER[b] > ROOM_LAYER[a]]
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def mermaid() -> str:
    """The layers as a Mermaid flowchart: one box per layer, an arrow from each room to
    the rooms it imports from (the foundations, which every room uses, without their
    arrows; an import already implied by a path of arrows is not drawn again)."""
    lines = ["```mermaid", "flowchart BT"]
    for i, (name, rooms, _) in enumerate(LAYERS):
        shown = [r for r in rooms if not r.startswith("__")]
        lines.append(f'  subgraph L{i}["{i}. {name}"]')
        lines += [f"    {r}" for r in shown]
        lines.append("  end")
    hidden = set(LAYERS[0][1]) | {"__init__", "__main__"}
    edges = {(a, b) for a, b in room_edges() if a not in hidden and b not in hidden}
    for a, b in sorted(_reduce(edges)):
        lines.append(f"  {a} --> {b}")
    lines.append("```")
    return "\n".join(lines)


def _reduce(edges: set) -> set:
    """The transitive reduction: drop a -> c where a reaches c through another room."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)

    def reach(start, skip):
        seen, todo = set(), [n for n in graph.get(start, ()) if n != skip]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(graph.get(n, ()))
        return seen
    return {(a, b) for a, b in edges if b not in reach(a, b)}


def layers_markdown() -> str:
    """The layers as a Markdown table: where a new wall, preset, planner or lesson goes."""
    rows = ["| layer | rooms (`snlab/...`) | what goes there |", "|---|---|---|"]
    for i, (name, rooms, what) in enumerate(LAYERS):
        shown = ", ".join(f"`{r}`" for r in rooms if not r.startswith("__"))
        rows.append(f"| {i}. {name} | {shown} | {what} |")
    return "\n".join(rows)

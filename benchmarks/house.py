"""The shape of the library package, measured over its source with ``ast``: modules, the import
graph (the imports between the package's own modules, late imports inside functions included),
its cycles, the imports that run upward (from a module on a lower floor to one on a higher floor
of FLOORS), and the longest functions.

    python benchmarks/house.py [PACKAGE_DIR] [--top 10]

Prints figures, asserts nothing: the closing note of a redesign quotes it before and after.
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

# The layers of the house, ground first (supervise.LAYERS): a module may import from its own layer
# or below. A flat package (the house before its folders) is measured with FLOORS instead.
FLOORS = [
    ("ground", {"vocabulary", "thresholds", "cli", "contract", "probes", "state", "observation", "registry",
                "telemetry"}),
    ("knowledge", {"logs", "rules", "scan", "ranks", "slurm", "checkpoints", "stacks", "volumes"}),
    ("engine", {"engine", "judge", "recovery", "launch", "stop"}),
]
LAYERS = ("", "observe", "judge", "act", "guard", "tools")


def name_of(pkg: Path, p: Path) -> str:
    """'observe.probes' for supervise/observe/probes.py, 'contract' for supervise/contract.py,
    'observe.engines' for supervise/observe/engines/__init__.py."""
    parts = p.relative_to(pkg).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str, flat: bool) -> int:
    if flat:
        return next((i for i, (_, mods) in enumerate(FLOORS) if module in mods), len(FLOORS))
    return LAYERS.index(module.split(".")[0] if "." in module else "")


def floor_name(i: int, flat: bool) -> str:
    if flat:
        return FLOORS[i][0] if i < len(FLOORS) else "front door"
    return LAYERS[i] or "supervise (the contract)"


def _code(p: Path) -> bool:
    """A module with code: every file but an ``__init__`` that holds only its docstring (a layer's)."""
    body = ast.parse(p.read_text()).body
    return p.stem != "__init__" or len(body) > 1 or (body and not isinstance(body[0], ast.Expr))


def sources(pkg: Path) -> list[Path]:
    return sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts and _code(p))


def imports(pkg: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (relative or absolute, at any depth)."""
    names = {name_of(pkg, p) for p in sources(pkg)}
    out = {}
    for p in sources(pkg):
        me = name_of(pkg, p)
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:  # the flat package's relative imports
                    deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
                elif node.module and node.module.split(".")[0] == pkg.name:
                    rest = ".".join(node.module.split(".")[1:])
                    for a in node.names:
                        full = f"{rest}.{a.name}" if rest else a.name
                        deps.add(full if full in names else rest)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == pkg.name and len(parts) > 1:
                        deps.add(".".join(parts[1:]))
        out[me] = {d for d in deps if d in names and d != me}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def longest_functions(pkg: Path, top: int) -> list[tuple[int, str]]:
    found = []
    for p in sources(pkg):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{name_of(pkg, p)}.{node.name}"))
    return sorted(found, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", nargs="?", default=str(Path(__file__).resolve().parents[1] / "supervise"))
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    pkg = Path(a.package)
    flat = not any(p.parent != pkg for p in sources(pkg))
    graph = imports(pkg)
    lines = {name_of(pkg, p): len(p.read_text().splitlines()) for p in sources(pkg)}
    edges = sorted((m, d) for m, ds in graph.items() for d in ds)
    upward = [(m, d) for m, d in edges if floor(d, flat) > floor(m, flat)]
    comps = cycles(graph)
    print(f"modules: {len(graph)}, {sum(lines.values())} lines; imports between them: {len(edges)}")
    if not flat:
        for i, name in enumerate(LAYERS):
            mods = sorted(m for m in graph if floor(m, flat) == i)
            print(f"  {floor_name(i, flat)}/: {len(mods)} modules, {sum(lines[m] for m in mods)} lines")
    print(f"import cycles: {len(comps)}" + "".join(f"\n  {' <-> '.join(c)}" for c in comps))
    print(f"imports that run upward: {len(upward)}" + "".join(
        f"\n  {m} ({floor_name(floor(m, flat), flat)}) -> {d} ({floor_name(floor(d, flat), flat)})" for m, d in upward))
    print(f"the {a.top} longest functions (lines):")
    for n, name in longest_functions(pkg, a.top):
        print(f"  {n:4d}  {name}")


if __name__ == "__main__":
    main()

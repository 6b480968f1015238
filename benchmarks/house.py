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

# The floors of the house, ground first: a module may import from its own floor or below.
# A module not listed sits on the top floor (a front door).
FLOORS = [
    ("ground", {"vocabulary", "thresholds", "cli", "contract", "probes", "state", "observation", "registry",
                "telemetry"}),
    ("knowledge", {"logs", "rules", "scan", "ranks", "slurm", "checkpoints", "stacks", "volumes"}),
    ("engine", {"engine", "judge", "recovery", "launch", "stop"}),
]


def floor(module: str) -> int:
    return next((i for i, (_, mods) in enumerate(FLOORS) if module in mods), len(FLOORS))


def imports(pkg: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (relative or absolute, at any depth)."""
    names = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    out = {}
    for p in sorted(pkg.glob("*.py")):
        if p.stem == "__init__":
            continue
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    deps.add(node.module.split(".")[0])
                elif node.level == 1:
                    deps |= {a.name for a in node.names}
                elif node.module and node.module.split(".")[0] == pkg.name:
                    rest = node.module.split(".")[1:]
                    deps |= {rest[0]} if rest else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == pkg.name and len(parts) > 1:
                        deps.add(parts[1])
        out[p.stem] = {d for d in deps if d in names and d != p.stem}
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
    for p in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{p.stem}.{node.name}"))
    return sorted(found, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", nargs="?", default=str(Path(__file__).resolve().parents[1] / "supervise"))
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    pkg = Path(a.package)
    graph = imports(pkg)
    lines = {p.stem: len(p.read_text().splitlines()) for p in pkg.glob("*.py") if p.stem != "__init__"}
    edges = sorted((m, d) for m, ds in graph.items() for d in ds)
    upward = [(m, d) for m, d in edges if floor(d) > floor(m)]
    comps = cycles(graph)
    print(f"modules: {len(graph)}, {sum(lines.values())} lines; imports between them: {len(edges)}")
    print(f"import cycles: {len(comps)}" + "".join(f"\n  {' <-> '.join(c)}" for c in comps))
    print(f"imports that run upward: {len(upward)}" + "".join(
        f"\n  {m} ({FLOORS[floor(m)][0] if floor(m) < len(FLOORS) else 'front door'}) -> {d} "
        f"({FLOORS[floor(d)][0] if floor(d) < len(FLOORS) else 'front door'})" for m, d in upward))
    print(f"the {a.top} longest functions (lines):")
    for n, name in longest_functions(pkg, a.top):
        print(f"  {n:4d}  {name}")


if __name__ == "__main__":
    main()

"""The house's folders are its layers (supervise/__init__.py): every import between the package's
own modules, late imports inside functions included, runs from a layer to its own or one below,
and there is no import circle. Read from the source with ast, so a late import counts too."""
import ast
from pathlib import Path

import pytest

import supervise
from supervise import LAYERS

PKG = Path(supervise.__file__).parent
MODULES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(p: Path) -> str:
    rel = p.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


NAMES = {dotted(p) for p in MODULES}


def layer(mod: str) -> int:
    parts = mod.split(".")
    folder = parts[1] if len(parts) > 2 else ""   # supervise.observe.probes -> observe; supervise.contract -> ""
    if len(parts) == 2 and parts[1] in LAYERS:     # a layer's own __init__
        folder = parts[1]
    return LAYERS.index(folder)


def imports_of(p: Path) -> set:
    here = dotted(p)
    out = set()
    for node in ast.walk(ast.parse(p.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{here}: a relative import (from {'.' * node.level}{node.module or ''}): " \
                                    "write supervise.<layer>.<module>"
            if node.module and node.module.split(".")[0] == "supervise":
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out.add(full if full in NAMES else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "supervise"}
    return {m for m in out if m in NAMES and m != here and m != "supervise"}


GRAPH = {dotted(p): imports_of(p) for p in MODULES}


def test_every_module_sits_in_a_layer_folder():
    folders = {p.relative_to(PKG).parts[0] for p in MODULES if p.parent != PKG}   # a folder inside a layer is of it
    assert folders <= set(LAYERS), f"a folder that is not a layer: {sorted(folders - set(LAYERS))}"
    for name in LAYERS[1:]:
        doc = ast.get_docstring(ast.parse((PKG / name / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"supervise/{name}/__init__.py: say what the layer may import"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_run_down_the_layers(module):
    up = sorted(d for d in GRAPH[module] if layer(d) > layer(module))
    assert not up, f"{module} ({LAYERS[layer(module)] or 'contract'}) imports a higher layer: {up}"


def test_no_import_circle():
    seen, on, circle = set(), [], []

    def visit(m):
        if m in on:
            circle.append(on[on.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on.append(m)
        for d in sorted(GRAPH.get(m, ())):
            visit(d)
        on.pop()

    for m in sorted(GRAPH):
        visit(m)
    assert not circle, " <-> ".join(circle[0])


def test_the_judge_is_pure():
    """judge.table reads no file, process or clock: it imports nothing that does, and calls no
    open/time/os."""
    tree = ast.parse((PKG / "judge" / "table.py").read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
           {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not mods & {"os", "time", "subprocess", "pathlib", "socket", "psutil"}, mods
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open" not in calls

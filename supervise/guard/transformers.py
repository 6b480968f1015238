"""The project's transformers: a script written with transformers v4's argument names is refused
when the project's own interpreter has v5 installed (found from its venv, pyenv or prefix
without running it), with the v5 names as the fix. Standard library only: hot path."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Optional

from supervise.guard.shell import Call, deny

V4_ARGS = re.compile(r"\b(evaluation_strategy|overwrite_output_dir)\s*=")


# ----------------------------------------------------------------------------- the project's transformers
# The version that matters is the one the user's training imports, not the one of the interpreter that
# runs this hook (hooks.json runs the python3 on PATH, often a bare one): found by reading folders,
# never by running a Python or importing transformers (a hook is a hot path).
VENV_DIRS = (".venv", "venv")
DIST_INFO = re.compile(r"^transformers-(\d[^-]*?)(?:-py\d.*)?\.(?:dist|egg)-info$", re.I)
VERSION_DIR = re.compile(r"^python(\d+\.\d+)$")


def _transformers_in(site: Path) -> Optional[str]:
    """The version of the transformers installed in the site-packages folder ``site`` (its
    ``transformers-VERSION.dist-info``, or .egg-info), the highest if there are several; None when none."""
    try:
        names = os.listdir(site)
    except OSError:
        return None
    found = [m[1] for m in map(DIST_INFO.match, names) if m]
    return max(found, key=lambda v: [int(x) if x.isdigit() else -1 for x in re.split(r"[.+-]", v)]) if found else None


def _venv_sites(venv: Path, home: str) -> list[Path]:
    """A virtual environment's site-packages, then its base Python's when its pyvenv.cfg includes them."""
    sites = sorted(venv.glob("lib/python3*/site-packages")) + [venv / "Lib" / "site-packages"]
    try:
        cfg = dict(ln.partition("=")[::2] for ln in (venv / "pyvenv.cfg").read_text(errors="replace").splitlines())
    except OSError:
        cfg = {}
    cfg = {k.strip().lower(): v.strip() for k, v in cfg.items()}
    if cfg.get("include-system-site-packages", "").lower() == "true" and cfg.get("home"):
        sites += _prefix_sites(Path(cfg["home"]).parent, "", home) or []
    return sites


def _prefix_sites(prefix: Path, exe_name: str, home: str) -> Optional[list[Path]]:
    """The site-packages of the Python installed under ``prefix`` (/usr, /opt/conda, ~/.pyenv/versions/3.11.7),
    in its sys.path's order: the user's ~/.local, then Debian's local and system folders, then the
    prefix's own; the version from ``exe_name`` (python3.11) when it names one. None when no Python is
    installed there (no lib/pythonX.Y)."""
    m = VERSION_DIR.match(exe_name)
    try:
        versions = [m[1]] if m else sorted((VERSION_DIR.match(d)[1] for d in os.listdir(prefix / "lib")
                                            if VERSION_DIR.match(d)), reverse=True)
    except OSError:
        return None
    if not versions or not any((prefix / "lib" / f"python{v}").is_dir() for v in versions):
        return None
    sites = []
    for v in versions:
        sites += [Path(home) / ".local" / "lib" / f"python{v}" / "site-packages",
                  prefix / "local" / "lib" / f"python{v}" / "dist-packages",
                  prefix / "lib" / f"python{v}" / "site-packages", prefix / "lib" / f"python{v}" / "dist-packages"]
    return sites + [prefix / "lib" / "python3" / "dist-packages"]


def _pyenv_version(root: Path, cwd: Path, env: dict) -> str:
    """The version a pyenv shim runs: $PYENV_VERSION, else the nearest .python-version, else root/version."""
    if env.get("PYENV_VERSION"):
        return env["PYENV_VERSION"].split(":")[0]
    for d in (cwd, *cwd.parents, root):
        f = d / (".python-version" if d != root else "version")
        try:
            words = f.read_text(errors="replace").split()
        except OSError:
            continue
        return words[0] if words else ""
    return ""


def _interpreter_sites(exe: Path, cwd: Path, env: dict, home: str) -> Optional[list[Path]]:
    """The site-packages of the Python at ``exe`` (found on PATH), read from the folders around it,
    without running it: a venv's (its pyvenv.cfg), a pyenv shim's version's, or its prefix's; None
    when it is none of these (then the next one on PATH is read)."""
    if (exe.parent.parent / "pyvenv.cfg").is_file():  # .venv/bin/python: a link out of the venv, not followed
        return _venv_sites(exe.parent.parent, home)
    if exe.parent.name == "shims" and (exe.parent.parent / "versions").is_dir():
        version = _pyenv_version(exe.parent.parent, cwd, env)
        target = exe.parent.parent / "versions" / version / "bin" / exe.name
        return _interpreter_sites(target, cwd, env, home) if version and version != "system" else None
    try:
        real = exe.resolve()
    except (OSError, RuntimeError):
        return None
    if (real.parent.parent / "pyvenv.cfg").is_file():
        return _venv_sites(real.parent.parent, home)
    return _prefix_sites(real.parent.parent, real.name, home)


def project_python(cwd: str, env: dict) -> Optional[tuple[str, list[Path]]]:
    """The Python the user's training runs, found without running one, and its site-packages folders:
    the .venv or venv of ``cwd`` or a folder above it, else $VIRTUAL_ENV, else $CONDA_PREFIX, else the
    first python3 or python on PATH (a venv, a pyenv shim's version, a prefix); None when there is none."""
    home = env.get("HOME") or os.path.expanduser("~")
    here = Path(os.path.abspath(os.path.expanduser(cwd or ".")))
    for d in (here, *here.parents):
        for name in VENV_DIRS:
            if (d / name / "pyvenv.cfg").is_file():
                return str(d / name), _venv_sites(d / name, home)
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = Path(env.get(var) or "")
        if env.get(var) and prefix.is_absolute():
            sites = _venv_sites(prefix, home) if (prefix / "pyvenv.cfg").is_file() else _prefix_sites(prefix, "", home)
            if sites:
                return str(prefix), sites
    for d in env.get("PATH", "").split(os.pathsep):
        if not d:
            continue
        for name in ("python3", "python"):
            exe = Path(d if os.path.isabs(d) else here / d) / name
            if exe.is_file() and os.access(exe, os.X_OK):
                sites = _interpreter_sites(exe, here, env, home)
                if sites is not None:
                    return str(exe), sites
    return None


def installed_transformers(cwd: str, env: dict) -> tuple[Optional[str], str]:
    """(the transformers version the project's Python has, or None when it has none; that Python, in
    words). Read from project_python's site-packages; only when no project Python is found at all,
    from this hook's own interpreter's metadata."""
    found = project_python(cwd, env)
    if found is None:
        from importlib import metadata  # the rare path: no Python of the user's found
        try:
            return metadata.version("transformers"), f"{sys.executable} (no other Python found)"
        except (metadata.PackageNotFoundError, ValueError):
            return None, f"{sys.executable} (no other Python found)"
    where, sites = found
    return next((v for v in map(_transformers_in, sites) if v), None), where


def _major(version: Optional[str]) -> Optional[int]:
    m = re.match(r"\d+", version or "")
    return int(m[0]) if m else None


def rule_v5_arguments(call: Call) -> Optional[str]:
    """evaluation_strategy= and overwrite_output_dir= in a .py file, refused when the project's Python has
    transformers v5 or later (they raise TypeError there). With v4 they are fine, and when no
    transformers is found for the project the version is unknown: allowed (a v4 user must not be
    blocked; v5 fails loudly at the first TrainingArguments, before any GPU time), and said on stderr."""
    if call.tool not in ("Write", "Edit", "MultiEdit") or not call.path.endswith(".py"):
        return None
    found = sorted(set(V4_ARGS.findall(call.content)))
    if not found:
        return None
    version, where = installed_transformers(call.cwd, call.env)
    major = _major(version)
    if major is None:
        call.memo.setdefault("notes", []).append(
            f"supervise guard: v5_arguments allowed {', '.join(found)} in {call.path}: no transformers is installed "
            f"for {where}, so its version is unknown (v4 keeps them; v5 raises TypeError)")
        return None
    if major < 5:
        return None
    return deny("v5_arguments", f"{', '.join(found)} were removed in transformers v5 ({version} is installed for "
                 f"{where}): TrainingArguments raises TypeError.", "write eval_strategy= instead of "
                 "evaluation_strategy=, and drop overwrite_output_dir=")

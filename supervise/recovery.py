"""Recovery: the one line that relaunches a run from its last checkpoint, the watchdog's line
beside it, and the rule that stops an agent relaunching a run that makes no progress.

The relaunch line is built from the start record (contract v0.2: ``argv`` and ``cwd``) and
passes the launch guard as is: one physical line, ``python -u``, the quiet variables, output
appended to ``RUN_DIR/train.log``. The kind of anomaly decides the change (see
references/recovery.md):

- ``oom``: halve the per-device batch, double gradient accumulation (same effective batch);
- ``nan``, ``diverged``, ``grad_explode``, ``loss_spike`` (and a ``fatal`` whose reason is a
  non-finite value): halve the learning rate;
- ``disk`` (once space is freed), ``dead``, ``stall``, ``crash``, ``fatal``, ``preempted``, ``node_fail``, ``rank_hang``,
  ``straggler``, ``gpu_idle`` and no kind at all (DEAD): the same command, resumed;
- every other kind (labels, data, a plan that does not fit the window): no line, since
  relaunching does not fix it.

Flag values the command does not spell out are read from ``RUN_DIR/hparams.json`` (the
templates write their resolved configuration there). Standard library only: check-in imports
this on the hot path.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Iterable, Optional

from .guard import QUIET
from .rules import Anomaly, anomaly

ENV = {"PYTHONUNBUFFERED": "1", **QUIET}
BUNDLE = Path(__file__).resolve().parents[1]
HPARAMS = "hparams.json"
NO_PROGRESS_AFTER = 3     # relaunches without the checkpoint's step moving

HALVE_BATCH = {"oom"}
HALVE_LR = {"nan", "diverged", "grad_explode", "loss_spike"}
SAME = {None, "disk", "dead", "stall", "crash", "fatal", "preempted", "node_fail", "rank_hang", "straggler", "gpu_idle"}

# Flag spellings, the templates' first: (--batch-size, --batch, and the Trainer's names).
BATCH_FLAGS = ("--batch-size", "--batch", "--per-device-train-batch-size", "--per_device_train_batch_size")
ACCUM_FLAGS = ("--grad-accum", "--gradient-accumulation-steps", "--gradient_accumulation_steps")
LR_FLAGS = ("--lr", "--learning-rate", "--learning_rate")
RESUME_FLAGS = ("--resume", "--resume-from-checkpoint", "--resume_from_checkpoint")


def _find(argv: list[str], names: tuple) -> Optional[tuple[int, str, str]]:
    """(index, flag as spelled, value) of the last occurrence of any of ``names``."""
    hit = None
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag in names:
            if eq:
                hit = (i, flag, value)
            elif i + 1 < len(argv):
                hit = (i, flag, argv[i + 1])
    return hit


def _set(argv: list[str], names: tuple, value: str) -> list[str]:
    """argv without any of ``names`` (both ``--f v`` and ``--f=v``), then ``--f value`` with the
    spelling the command used (else the first name)."""
    found = _find(argv, names)
    spelled = found[1] if found else names[0]
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        flag, eq, _ = word.partition("=")
        if flag in names:
            skip = not eq
            continue
        out.append(word)
    return out + [spelled, value]


def _number(text) -> Optional[float]:
    try:
        x = float(text)
    except (TypeError, ValueError):
        return None
    return x if x == x and x not in (float("inf"), float("-inf")) else None


def _hparams(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / HPARAMS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _value(argv: list[str], names: tuple, hparams: dict, key: str) -> Optional[float]:
    found = _find(argv, names)
    return _number(found[2]) if found else _number(hparams.get(key))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) >= 1 else f"{x:.6g}"


def change_for(kind: Optional[str], message: str = "") -> Optional[str]:
    """'batch', 'lr', 'same', or None (no relaunch) for an anomaly kind."""
    if kind == "fatal" and "non-finite" in message:
        return "lr"
    if kind in HALVE_BATCH:
        return "batch"
    if kind in HALVE_LR:
        return "lr"
    if kind in SAME:
        return "same"
    return None


def relaunch_argv(start: dict, kind: Optional[str], run_dir, message: str = "") -> Optional[list[str]]:
    """The training command's argv (the script and its flags) for the relaunch, or None."""
    argv = start.get("argv") if isinstance(start, dict) else None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return None
    change = change_for(kind, message)
    if change is None:
        return None
    argv, hp = list(argv), _hparams(Path(run_dir))
    if change == "batch":
        batch = _value(argv, BATCH_FLAGS, hp, "batch_size")
        accum = _value(argv, ACCUM_FLAGS, hp, "grad_accum") or 1
        if batch is None or batch < 2 or not float(batch).is_integer() or not float(accum).is_integer():
            return None  # a batch of one cannot be halved: a smaller model or sequence, or another GPU
        argv = _set(argv, BATCH_FLAGS, _fmt(batch // 2))
        argv = _set(argv, ACCUM_FLAGS, _fmt(accum * 2))
    elif change == "lr":
        lr = _value(argv, LR_FLAGS, hp, "lr")
        if lr is None or lr <= 0:
            return None
        argv = _set(argv, LR_FLAGS, _fmt(lr / 2))
    if not any(w.partition("=")[0] in RESUME_FLAGS for w in argv):
        argv.append("--resume")
    return argv


def relaunch_line(start: dict, kind: Optional[str], run_dir, *, message: str = "",
                  python: Optional[str] = None) -> Optional[str]:
    """One physical line that relaunches the run from its last checkpoint, as the agent can run
    it (it passes supervise.guard): ``cd CWD && mkdir -p RUN && ENV python -u ARGV --resume >>
    RUN/train.log 2>&1``, with the change ``kind`` calls for. None when the start record lacks
    argv or cwd, when relaunching does not fix the kind, or when the change cannot be made
    (a batch of one, an unknown learning rate): then the agent asks the user.

    ``message`` is the anomaly's line (a ``fatal`` caused by a non-finite value halves the LR);
    ``python`` the interpreter [the start record's ``python``, else ``python``]."""
    argv = relaunch_argv(start, kind, run_dir, message)
    cwd = start.get("cwd") if isinstance(start, dict) else None
    if argv is None or not isinstance(cwd, str) or not cwd:
        return None
    run = Path(os.path.abspath(run_dir))
    world = start.get("world_size")
    exe = python or start.get("python") or "python"
    if isinstance(world, int) and not isinstance(world, bool) and world > 1:
        launch = ["torchrun", "--standalone", f"--nproc_per_node={world}", *argv]
    else:
        launch = [exe, "-u", *argv]
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    q = shlex.quote
    return (f"cd {q(cwd)} && mkdir -p {q(str(run))} && {env} {shlex.join(launch)} "
            f">> {q(str(run / 'train.log'))} 2>&1")


def watchdog_line(run_dir, *, python: Optional[str] = None) -> str:
    """The watchdog for the relaunched attempt, to run beside the relaunch line (it watches the
    records after the last start record, so the new attempt's)."""
    exe = python or sys.executable or "python3"
    return shlex.join([exe, str(BUNDLE / "scripts" / "watchdog.py"), os.path.abspath(run_dir)])


def began_at(records: Iterable[dict]) -> list[tuple[dict, Optional[int]]]:
    """(start record, the first step it logged or None) per attempt, oldest first, from a metrics
    file's records in order: the input of ``no_progress`` (a resumed attempt's first step lies one
    logging interval after the checkpoint it began at, so equal values mean the same checkpoint)."""
    out: list = []
    for rec in records:
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "start":
            out.append([rec, None])
        elif out and out[-1][1] is None and "loss" in rec and isinstance(rec.get("step"), int):
            out[-1][1] = rec["step"]
    return [(a, b) for a, b in out]


def no_progress(starts_and_checkpoint_steps: Iterable[tuple[dict, Optional[int]]], *,
                current: Optional[int] = None, after: int = NO_PROGRESS_AFTER) -> Optional[Anomaly]:
    """``no_progress`` when the last ``after`` relaunches all began at the same checkpoint step.

    ``starts_and_checkpoint_steps``: one (start record, step) per attempt, oldest first; step is
    where that attempt began (the checkpoint it resumed from, or its first logged step: one
    measure throughout), None when it logged nothing. The first attempt is the launch, the
    others relaunches; a relaunch with None began nowhere visible and counts as no progress.
    ``current``: the same measure now (the latest checkpoint's step), when known: a last attempt
    that moved it made progress."""
    relaunches = [step for _start, step in list(starts_and_checkpoint_steps)[1:]]
    if len(relaunches) < after:
        return None
    known = {s for s in relaunches[-after:] if s is not None}
    if len(known) > 1:
        return None
    step = known.pop() if known else None
    if current is not None and step is not None and current != step:
        return None
    return anomaly("no_progress", f"relaunches without the checkpoint step moving = {after} >= {after}",
                   step or 0, "Stop relaunching: read the last error in check-in, fix its cause or ask the user, "
                   "then relaunch once")

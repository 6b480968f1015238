"""The watchdog's poll loop: observe (engine.py) -> judge (judge.py) -> watchdog.json, until a
verdict.

``python scripts/watchdog.py RUN_DIR`` exits 0 with ``OK done: ...`` when the current run's
completion sentinel appears (and its visible trainer exited), 7 with ``ANOMALY <kind>: ...`` the
first poll an anomaly holds, 2 on bad usage. Nothing else is printed per poll: the agent reads
this output when the job ends. Each poll also writes ``RUN_DIR/watchdog.json`` atomically.
Check-in, smoke and plot call ``engine.assess(run_dir)``: the same observer and judge, once.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import registry
from . import slurm as sl
from .cli import EXIT_USAGE, Parser, count, duration, fraction, positive_float, positive_int, run_dir_arg
from .contract import LOG, METRICS, SENTINEL, WATCHDOG_STATE, atomic_write_json, is_number, why_unreadable, \
    why_unwritable
from .engine import Observer
from .judge import judge
from .launch import run_on_exit
from .observation import Verdict
from .rules import Thresholds


def _typed(value, kind, default=None):
    """``value`` when it is a ``kind`` (bool never counts as a number), else ``default``."""
    if kind in (int, float):
        return value if is_number(value) and (kind is float or float(value).is_integer()) else default
    return value if isinstance(value, kind) else default


@dataclass
class WatchState:
    """What ``watchdog.json`` holds: written atomically each poll, read by check-in."""

    run_dir: str = ""
    watchdog_pid: Optional[int] = None
    started: Optional[float] = None
    last_poll: Optional[float] = None
    polls: int = 0
    poll_interval: Optional[float] = None
    state: str = "watching"
    kind: Optional[str] = None
    message: Optional[str] = None
    step: int = 0
    total_steps: Optional[int] = None
    run_id: Optional[str] = None
    attempt: Optional[int] = None
    records: dict = field(default_factory=dict)
    pids: list = field(default_factory=list)
    gpu: object = None
    warnings: list = field(default_factory=list)
    slurm_job: Optional[str] = None
    slurm_state: Optional[str] = None
    thresholds: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)   # the watchdog's flags after RUN_DIR

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, obj) -> Optional["WatchState"]:
        """A watchdog.json as read from disk; None when it is not an object. Wrong-typed
        fields take their defaults: the file is input, not trusted."""
        if not isinstance(obj, dict):
            return None
        types = {"run_dir": str, "watchdog_pid": int, "started": float, "last_poll": float, "polls": int,
                 "poll_interval": float, "state": str, "kind": str, "message": str, "step": int,
                 "total_steps": int, "run_id": str, "attempt": int, "records": dict, "pids": list,
                 "warnings": list, "thresholds": dict, "slurm_job": str, "slurm_state": str, "argv": list}
        out = cls()
        for name, kind in types.items():
            default = getattr(out, name)
            setattr(out, name, _typed(obj.get(name), kind, default))
        out.gpu = obj.get("gpu") if isinstance(obj.get("gpu"), (str, list)) else None
        out.pids = [p for p in out.pids if isinstance(p, dict)]
        out.warnings = [w for w in out.warnings if isinstance(w, str)]
        out.argv = [a for a in out.argv if isinstance(a, str)]
        return out


class Watchdog:
    """The watchdog: an ``Observer`` and ``judge`` per poll, the state saved to watchdog.json."""

    def __init__(self, run_dir, thresholds: Thresholds = Thresholds(), **observer):
        self.observer = Observer(run_dir, thresholds, **observer)
        self.th = thresholds
        self.run_dir = self.observer.run_dir
        self.verdict = Verdict("watching")
        self.save_error = ""
        self.argv: tuple = ()   # the flags this watchdog was started with (check-in offers them again)
        self._thresholds = dataclasses.asdict(thresholds)

    def poll(self) -> Verdict:
        self.verdict = judge(self.observer.observe(), self.th)
        self.save()
        return self.verdict

    def stop(self, signame: str) -> Verdict:
        o = self.observer
        self.verdict = Verdict("stopped", f"STOPPED: watchdog ended by {signame} after {o.polls} polls; "
                                          f"no anomaly seen up to step {o.run.last_step}", headline="STOPPED")
        self.save()
        return self.verdict

    def snapshot(self) -> WatchState:
        o, obs, v = self.observer, self.observer.last, self.verdict
        r, run = o.reader, o.run
        return WatchState(
            run_dir=str(self.run_dir.resolve()), watchdog_pid=os.getpid(), started=o.watch_started,
            last_poll=o.clock(), polls=o.polls, poll_interval=self.th.poll, state=v.state,
            kind=v.kind, message=v.line or None, step=run.last_step,
            total_steps=run.start.get("total_steps"), run_id=run.start.get("run_id"),
            attempt=run.start.get("attempt"),
            records={"lines": r.lines, "steps": run.n_steps, "evals": run.n_evals, "bad_lines": r.bad_lines,
                     "last_bad": r.last_bad or None, "unknown": run.unknown, "resets": r.resets,
                     "starts": o.rules.starts, "torn_tail": r.torn, "bytes_read": r.bytes_read,
                     "skipped_bytes": r.skipped_bytes},
            pids=[{"pid": p.pid, "state": p.state, "why": p.why} for p in (obs.processes if obs else ())],
            gpu=list(obs.gpu_lines) if obs else None,
            warnings=[w.message for w in v.warnings] + list(v.notes),
            slurm_job=o.slurm_job, slurm_state=obs.slurm.state if obs and obs.slurm else None,
            thresholds=self._thresholds, argv=list(self.argv))

    def save(self) -> None:
        try:
            atomic_write_json(self.run_dir / WATCHDOG_STATE, self.snapshot().to_json(), indent=None)
            self.save_error = ""
        except OSError as e:
            if not self.save_error:  # say it once; the verdict still reaches stdout
                print(f"watchdog.py: warning: cannot write {self.run_dir / WATCHDOG_STATE}: {e.strerror or e}; "
                      "check-in will not see this watchdog", file=sys.stderr, flush=True)
            self.save_error = str(e)


class _Wake(Exception):
    pass


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run(watcher: Watchdog, out=None, on_exit: Optional[str] = None) -> int:
    """Poll until done, an anomaly, or SIGTERM/SIGINT/SIGHUP; print the one final line; exit code.
    A second signal while stopping changes nothing: one line, exit 0, never a traceback.
    ``on_exit``: a shell command run once, detached, after the line (launch.run_on_exit)."""
    out = out or sys.stdout
    flags = {"sleeping": False, "signal": None}

    def on_signal(signum, frame):
        if flags["signal"] is None:
            flags["signal"] = signal.Signals(signum).name
        if flags["sleeping"]:
            flags["sleeping"] = False
            raise _Wake()

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        while True:
            if flags["signal"]:
                verdict = watcher.stop(flags["signal"])
                break
            verdict = watcher.poll()
            if verdict.state not in ("watching", "finishing"):
                break
            try:
                flags["sleeping"] = True
                if not flags["signal"]:
                    time.sleep(min(watcher.th.poll, verdict.recheck_in or watcher.th.poll))
            except _Wake:
                pass
            finally:
                flags["sleeping"] = False
        try:
            print(verdict.line, file=out, flush=True)
        except (BrokenPipeError, OSError):
            pass  # whoever read stdout is gone; the verdict is in watchdog.json all the same
        if on_exit:
            run_on_exit(on_exit, line=verdict.line, kind=verdict.kind,
                        code=verdict.code, run_dir=watcher.run_dir)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return verdict.code


def _threshold_type(name, default, is_duration):
    if is_duration:
        return duration
    if name in ("throughput_drop", "chance_margin", "min_auroc", "straggler_ratio"):
        return fraction
    if isinstance(default, int):
        return count if name in ("min_auroc_step", "chance_step", "baseline_steps", "warmup_steps",
                                 "overfit_evals") else positive_int
    return positive_float if name != "stall_factor" else _nonnegative


def _nonnegative(text):
    return 0.0 if str(text).strip() in ("0", "0.0") else positive_float(text)


def _show(default, unit, is_duration):
    if is_duration:
        return f"{default:g}s"
    if unit in ("%", "fraction", "AUROC", "grad norm", "x"):
        return f"{default:g}{unit}" if unit in ("%", "x") else f"{default:g}"
    return f"{default:g} {unit}"


def build_parser() -> Parser:
    p = Parser(prog="watchdog.py", description=(
        "Watch a training run directory; exit 0 with 'OK done: ...' when the current run's completion "
        "sentinel appears, 7 with 'ANOMALY <kind>: ...' on the first poll an anomaly holds, 2 on bad usage. "
        "The run's processes are found by themselves: --pid, the start record's pid, and every process "
        "whose output goes to RUN_DIR/train.log. Durations are seconds, or a number with s, m or h "
        "(90s, 6m, 3h)."))
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg,
                   help="the run directory (metrics.jsonl, train.log, final_val_metrics.json)")
    p.add_argument("--pid", type=positive_int, action="append", default=[], metavar="PID",
                   help="a training process to watch (repeatable); default: found from the start record and train.log")
    p.add_argument("--log", metavar="PATH", help="the training log [default: RUN_DIR/train.log]")
    p.add_argument("--slurm-job", metavar="ID", type=slurm_id,
                   help="follow this Slurm job with squeue/sacct: PENDING is no stall, the scheduler's end "
                        "states are verdicts (OUT_OF_MEMORY, NODE_FAIL, TIMEOUT, PREEMPTED, FAILED)")
    p.add_argument("--checkpoint-dir", action="append", default=[], metavar="DIR",
                   help="a folder of the run's checkpoints to follow for the disk rule (repeatable); default: the "
                        "start record's checkpoint_dir, else RUN_DIR/checkpoints")
    p.add_argument("--on-exit", metavar="CMD",
                   help="a shell command run once, detached, when the watchdog ends, with SUPERVISE_VERDICT, "
                        "SUPERVISE_KIND, SUPERVISE_EXIT_CODE, SUPERVISE_RUN_DIR, SUPERVISE_SESSION_ID set "
                        "(references/session.md)")
    p.add_argument("--sentinel", default=SENTINEL, metavar="NAME", type=sentinel_name,
                   help=f"completion sentinel, a file name in RUN_DIR [default: {SENTINEL}]")
    for name, default, unit, doc, is_duration in Thresholds.describe():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, dest=name, action="store_true", default=None, help=doc)
            continue
        metavar = "DURATION" if is_duration else {"%": "PERCENT", "x": "FACTOR"}.get(unit, unit.upper().replace(" ", "_"))
        p.add_argument(flag, dest=name, default=None, metavar=metavar,
                       type=_threshold_type(name, default, is_duration),
                       help=f"{doc} (default: {_show(default, unit, is_duration)})".replace("%", "%%"))
    return p


def slurm_id(text: str) -> str:
    """A Slurm job id: digits, optionally an array task (123 or 123_4)."""
    import argparse
    import re
    if not re.fullmatch(r"\d{1,12}(_\d{1,8})?", text or ""):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm job id; give the number sbatch printed (e.g. 4242)")
    return text


def sentinel_name(text: str) -> str:
    """A plain file name inside RUN_DIR: not empty, no folder, not . or .."""
    import argparse
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name; give the sentinel's name inside RUN_DIR "
                                         f"(default {SENTINEL})")
    return text


def main(argv=None, gpu=None) -> int:
    args = build_parser().parse_args(argv)
    given = {n: getattr(args, n) for n, *_ in Thresholds.describe() if getattr(args, n) is not None}
    th = Thresholds(**given)
    if th.grad_low >= th.grad_high:
        print(f"watchdog.py: error: --grad-low {th.grad_low:g} must be below --grad-high {th.grad_high:g}",
              file=sys.stderr)
        return EXIT_USAGE
    run_dir = Path(args.run_dir)
    why = why_unwritable(run_dir)
    if why:
        print(f"watchdog.py: error: run directory {run_dir} is not writable ({why}); "
              "pass a folder the watchdog can write watchdog.json into", file=sys.stderr)
        return EXIT_USAGE
    log = Path(args.log) if args.log else run_dir / LOG
    for path in (run_dir / METRICS, log, run_dir / args.sentinel):
        why = why_unreadable(path)
        if why:
            print(f"watchdog.py: error: {why}; the watchdog would be blind: fix it (a readable regular file) "
                  "and start again", file=sys.stderr)
            return EXIT_USAGE
    if args.slurm_job:
        job = sl.query(args.slurm_job)
        if job.error:
            print(f"watchdog.py: error: {job.error}", file=sys.stderr)
            return EXIT_USAGE
    watcher = Watchdog(run_dir, th, pids=args.pid, log=log, sentinel=args.sentinel, gpu=gpu,
                       num_labels_given="num_labels" in given, slurm_job=args.slurm_job,
                       checkpoint_dirs=tuple(args.checkpoint_dir))
    watcher.argv = tuple(sys.argv[2:] if argv is None else argv[1:])
    registry.register(run_dir, os.getpid(), args.pid)
    return run(watcher, on_exit=args.on_exit)

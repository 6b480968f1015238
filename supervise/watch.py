"""The watchdog's poll loop: read new lines -> rules -> probes -> verdict -> exit code.

``python scripts/watchdog.py RUN_DIR`` exits 0 with ``OK done: ...`` when the completion
sentinel appears, 7 with ``ANOMALY <kind>: ...`` the first poll an anomaly holds, 2 on bad
usage. Nothing else is printed per poll: the agent reads this output when the job ends.
Each poll also writes ``RUN_DIR/watchdog.json`` atomically.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import registry
from .cli import EXIT_ANOMALY, EXIT_OK, EXIT_USAGE, Parser, count, duration, fraction, positive_float, \
    positive_int, run_dir_arg
from .contract import LOG, METRICS, SENTINEL, WATCHDOG_STATE, TailReader, atomic_write_json, is_finite, \
    is_number, kind_of, read_json
from .logs import log_tail
from .probes import GpuReport, Nvml, ProcessWatch
from .rules import RULES, Anomaly, Thresholds, Window, evaluate

RECENT = 64          # step records kept for the rules (>= --sustain is all they need)
BASELINE_MAX = 10000 # sps values kept for the throughput baseline


class RunState:
    """What the metrics file has said so far, folded record by record into bounded state.
    Record-kind rules run on the window ending at each new record and latch their first hit."""

    def __init__(self, th: Thresholds = Thresholds(), num_labels_given: bool = False):
        self.th = th
        self.num_labels_given = num_labels_given
        self.start: Optional[dict] = None
        self.steps: deque = deque(maxlen=max(RECENT, th.sustain))
        self.baseline_sps: list = []
        self.last_eval: Optional[dict] = None
        self.best_eval: Optional[dict] = None
        self.first_inverted: Optional[dict] = None
        self.first_nonfinite: Optional[dict] = None
        self.fatal: Optional[dict] = None
        self.latched: dict = {}
        self._base: Optional[float] = None  # the throughput baseline, once it is complete
        self.last_step = 0
        self.n_steps = self.n_evals = self.unknown = 0

    @property
    def num_labels(self) -> int:
        n = (self.start or {}).get("num_labels")
        if not self.num_labels_given and is_number(n) and n >= 2:
            return int(n)
        return self.th.num_labels

    def add(self, rec: dict) -> None:
        kind = kind_of(rec)
        step = rec.get("step")
        if is_number(step) and step > self.last_step:
            self.last_step = int(step)
        if kind == "start":
            self.start = rec
        elif kind == "fatal":
            self.fatal = self.fatal or rec
        elif kind == "eval":
            self.n_evals += 1
            self.last_eval = rec
            auroc = rec.get("eval_auroc")
            if is_finite(auroc):
                if self.best_eval is None or auroc > self.best_eval["eval_auroc"]:
                    self.best_eval = rec
                if self.first_inverted is None and auroc <= 1 - self.th.min_auroc:
                    self.first_inverted = rec
            self._latch(("stuck_auroc",))
        elif kind == "step":
            self.n_steps += 1
            self.steps.append(rec)
            if self.first_nonfinite is None and (
                    not is_finite(rec.get("loss")) or ("grad_norm" in rec and not is_finite(rec["grad_norm"]))):
                self.first_nonfinite = rec
            sps = rec.get("sps")
            if (is_number(step) and step <= self.th.baseline_steps and is_finite(sps)
                    and len(self.baseline_sps) < BASELINE_MAX):
                self.baseline_sps.append(float(sps))
            if len(self.steps) >= self.th.sustain:
                self._latch(self._could_hold(rec))
        else:
            self.unknown += 1

    def _could_hold(self, rec: dict) -> tuple:
        """Record kinds whose condition the newest record meets: a sustained condition must hold
        on it, so most records cost a few comparisons and no rule call."""
        th, out = self.th, []
        grad, loss, sps, step = rec.get("grad_norm"), rec.get("loss"), rec.get("sps"), rec.get("step", 0)
        if is_finite(grad) and (grad > th.grad_high or grad < th.grad_low):
            out += ["grad_explode", "grad_collapse"]
        if is_finite(loss) and is_number(step) and step >= th.chance_step:
            chance = math.log(max(self.num_labels, 2))
            if abs(loss - chance) <= th.chance_margin * chance * 4:
                out.append("chance_loss")
        if is_finite(sps) and self.baseline_sps and is_number(step) and step > th.baseline_steps:
            if self._base is None:
                self._base = statistics.median(self.baseline_sps)
            if sps < self._base * (1 - th.throughput_drop):
                out.append("throughput")
        return tuple(out)

    def _latch(self, kinds) -> None:
        todo = [k for k in kinds if k not in self.latched]
        if not todo:
            return
        n = self.th.sustain
        w = Window(now=0.0, started=0.0, watch_started=0.0,
                   steps=tuple(self.steps)[-n:] if n else (), baseline_sps=tuple(self.baseline_sps),
                   last_eval=self.last_eval, last_step=self.last_step, num_labels=self.num_labels)
        for k in todo:
            found = RULES[k](w, self.th)
            if found is not None:
                self.latched[k] = found


@dataclass
class Verdict:
    state: str                     # watching | done | anomaly | stopped
    line: str = ""
    anomaly: Optional[Anomaly] = None

    @property
    def code(self) -> int:
        return EXIT_ANOMALY if self.state == "anomaly" else EXIT_OK


class Watcher:
    """One poll at a time over one run directory. ``gpu`` is any object with ``read() ->
    GpuReport`` (NVML by default; tests inject one)."""

    def __init__(self, run_dir, thresholds: Thresholds = Thresholds(), pids=(), log=None,
                 sentinel: str = SENTINEL, gpu=None, num_labels_given: bool = False, clock=time.time):
        self.run_dir = Path(run_dir)
        self.th = thresholds
        self.explicit_pids = tuple(pids)
        self.log = Path(log) if log else self.run_dir / LOG
        self.sentinel = self.run_dir / sentinel
        self.metrics = self.run_dir / METRICS
        self.reader = TailReader(str(self.metrics))
        self.state = RunState(thresholds, num_labels_given)
        self.gpu = gpu
        self.clock = clock
        self.watch_started = clock()
        self.procs = ProcessWatch()
        self.polls = 0
        self.idle_since: Optional[float] = None
        self.gpu_note = ""
        self.last_procs: list = []
        self.last_gpu: Optional[GpuReport] = None
        self.verdict = Verdict("watching")

    @property
    def pids(self) -> tuple:
        if self.explicit_pids:
            return self.explicit_pids
        pid = (self.state.start or {}).get("pid")
        return (int(pid),) if is_number(pid) and pid > 0 else ()

    def _done(self) -> Verdict:
        final = read_json(self.sentinel)
        facts = ""
        if isinstance(final, dict):
            nums = [(k, v) for k, v in final.items() if is_number(v)][:6]
            facts = "; " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in nums)
        total = (self.state.start or {}).get("total_steps")
        of = f"/{total}" if is_number(total) else ""
        ran = self.clock() - self.watch_started
        return Verdict("done", f"OK done: {self.sentinel.name} written at step {self.state.last_step}{of} "
                               f"after {ran:.0f}s of watching{facts}")

    def _started(self) -> float:
        births = [b for b in self.procs.birth.values() if b]
        return min([self.watch_started] + births)

    def _gpu(self, now: float, alive: bool) -> Optional[float]:
        if self.gpu is None:
            self.gpu = Nvml()
        report = self.gpu.read()
        self.last_gpu = report
        if not report.available:
            self.gpu_note = f"{report.note}; gpu_idle is off"
            self.idle_since = None
            return None
        util = max(g.util for g in report.for_pids(self.pids))
        if alive and util < self.th.gpu_idle_util:
            self.idle_since = self.idle_since if self.idle_since is not None else now
        else:
            self.idle_since = None
        return util

    def poll(self) -> Verdict:
        self.polls += 1
        done = self.sentinel.exists()  # first: a run that wrote it is done, whatever follows
        for rec in self.reader.records():
            self.state.add(rec)
        if done:
            return self._finish(self._done())
        now = self.clock()
        infos = [self.procs.read(pid) for pid in self.pids]
        self.last_procs = infos
        died = any(not p.alive for p in infos)
        if died and self.sentinel.exists():  # wrote its sentinel, then exited: done, never dead
            return self._finish(self._done())
        try:
            mtime = os.stat(self.metrics).st_mtime
        except OSError:
            mtime = None
        util = self._gpu(now, bool(infos) and not died)
        s = self.state
        window = Window(
            now=now, started=self._started(), watch_started=self.watch_started,
            steps=tuple(s.steps), baseline_sps=tuple(s.baseline_sps), last_eval=s.last_eval,
            first_inverted=s.first_inverted, first_nonfinite=s.first_nonfinite, fatal=s.fatal,
            last_step=s.last_step, metrics_mtime=mtime, processes=tuple(p.as_rule() for p in infos),
            log_tail=tuple(log_tail(self.log)) if died else (), num_labels=s.num_labels,
            gpu_util=util, gpu_idle_for=(now - self.idle_since) if self.idle_since is not None else 0.0)
        found = evaluate(window, self.th, s.latched)
        if found is not None:
            return self._finish(Verdict("anomaly", found.message, found))
        self.verdict = Verdict("watching")
        self.save()
        return self.verdict

    def _finish(self, verdict: Verdict) -> Verdict:
        self.verdict = verdict
        self.save()
        return verdict

    def stop(self, signame: str) -> Verdict:
        v = Verdict("stopped", f"STOPPED: watchdog ended by {signame} after {self.polls} polls; "
                               f"no anomaly seen up to step {self.state.last_step}")
        return self._finish(v)

    def snapshot(self) -> dict:
        s, r = self.state, self.reader
        a = self.verdict.anomaly
        return {
            "run_dir": str(self.run_dir.resolve()), "watchdog_pid": os.getpid(),
            "started": self.watch_started, "last_poll": self.clock(), "polls": self.polls,
            "poll_interval": self.th.poll, "state": self.verdict.state, "kind": a.kind if a else None,
            "message": self.verdict.line or None, "step": s.last_step,
            "total_steps": (s.start or {}).get("total_steps"),
            "records": {"lines": r.lines, "steps": s.n_steps, "evals": s.n_evals, "bad_lines": r.bad_lines,
                        "last_bad": r.last_bad or None, "unknown": s.unknown, "resets": r.resets,
                        "torn_tail": r.torn, "bytes_read": r.bytes_read},
            "pids": [{"pid": p.pid, "state": p.state} for p in self.last_procs],
            "gpu": self.gpu_note or [g.line() for g in (self.last_gpu.gpus if self.last_gpu else [])],
            "thresholds": dataclasses.asdict(self.th),
        }

    def save(self) -> None:
        try:
            atomic_write_json(self.run_dir / WATCHDOG_STATE, self.snapshot())
        except OSError:
            pass  # a full disk must not kill the watchdog; the verdict still reaches stdout


class _Wake(Exception):
    pass


def run(watcher: Watcher, out=None) -> int:
    """Poll until done, an anomaly, or SIGTERM/SIGINT; print the one final line; exit code."""
    out = out or sys.stdout
    flags = {"sleeping": False, "signal": None}

    def on_signal(signum, frame):
        flags["signal"] = signal.Signals(signum).name
        if flags["sleeping"]:
            raise _Wake()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            if flags["signal"]:
                verdict = watcher.stop(flags["signal"])
                break
            verdict = watcher.poll()
            if verdict.state != "watching":
                break
            try:
                flags["sleeping"] = True
                if not flags["signal"]:
                    time.sleep(watcher.th.poll)
            except _Wake:
                pass
            finally:
                flags["sleeping"] = False
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    try:
        print(verdict.line, file=out, flush=True)
    except (BrokenPipeError, OSError):
        pass  # whoever read stdout is gone; the verdict is in watchdog.json all the same
    return verdict.code


def _threshold_type(name, default, is_duration):
    if is_duration:
        return duration
    if name in ("throughput_drop", "chance_margin", "min_auroc"):
        return fraction
    if isinstance(default, int):
        return count if name in ("min_auroc_step", "chance_step", "baseline_steps") else positive_int
    return positive_float


def _show(default, unit, is_duration):
    if is_duration:
        return f"{default:g}s"
    if unit in ("%", "fraction", "AUROC", "grad norm"):
        return f"{default:g}{unit}" if unit == "%" else f"{default:g}"
    return f"{default:g} {unit}"


def build_parser() -> Parser:
    p = Parser(prog="watchdog.py", description=(
        "Watch a training run directory; exit 0 with 'OK done: ...' when the completion sentinel "
        "appears, 7 with 'ANOMALY <kind>: ...' on the first poll an anomaly holds, 2 on bad usage. "
        "Durations are seconds, or a number with s, m or h (90s, 6m, 3h)."))
    p.add_argument("run_dir", metavar="RUN_DIR", type=run_dir_arg,
                   help="the run directory (metrics.jsonl, train.log, final_val_metrics.json)")
    p.add_argument("--pid", type=positive_int, action="append", default=[], metavar="PID",
                   help="a training process to watch (repeatable); default: the start record's pid")
    p.add_argument("--log", metavar="PATH", help="the training log [default: RUN_DIR/train.log]")
    p.add_argument("--sentinel", default=SENTINEL, metavar="NAME",
                   help=f"completion sentinel in RUN_DIR [default: {SENTINEL}]")
    for name, default, unit, doc, is_duration in Thresholds.describe():
        metavar = "DURATION" if is_duration else {"%": "PERCENT"}.get(unit, unit.upper().replace(" ", "_"))
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar=metavar,
                       type=_threshold_type(name, default, is_duration),
                       help=f"{doc} (default: {_show(default, unit, is_duration)})".replace("%", "%%"))
    return p


def main(argv=None, gpu=None) -> int:
    args = build_parser().parse_args(argv)
    given = {n: getattr(args, n) for n, *_ in Thresholds.describe() if getattr(args, n) is not None}
    th = Thresholds(**given)
    if th.grad_low >= th.grad_high:
        print(f"watchdog.py: error: --grad-low {th.grad_low:g} must be below --grad-high {th.grad_high:g}",
              file=sys.stderr)
        return EXIT_USAGE
    run_dir = Path(args.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"watchdog.py: error: cannot create run directory {run_dir}: {e.strerror}; "
              "pass a writable folder", file=sys.stderr)
        return EXIT_USAGE
    watcher = Watcher(run_dir, th, pids=args.pid, log=args.log, sentinel=args.sentinel, gpu=gpu,
                      num_labels_given="num_labels" in given)
    registry.register(run_dir, os.getpid(), args.pid)
    return run(watcher)

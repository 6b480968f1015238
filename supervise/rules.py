"""Anomaly rules: one small pure function per kind over a ``Window`` of facts.

Each rule returns ``None`` or an ``Anomaly`` whose message has one shape:
``ANOMALY <kind>: <what> = <value> <op> <threshold> at step N. <fix>.``
Thresholds live in ``Thresholds``; every field is a watchdog flag (``--max-stall`` for
``max_stall``) with its unit and default in ``--help``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields
from typing import Callable, Optional

from .contract import is_finite

# Every kind, most specific first: when several hold in one poll the first one is reported.
KINDS = ("blind", "nan", "fatal", "oom", "crash", "node_fail", "preempted", "dead", "rank_hang",
         "stall", "no_telemetry", "no_progress", "diverged", "loss_spike", "inverted_labels",
         "stuck_auroc", "chance_loss", "grad_explode", "grad_collapse", "overfit", "throughput",
         "straggler", "gpu_idle", "timeout")


def _th(default, unit: str, doc: str, duration: bool = False):
    return field(default=default, metadata={"unit": unit, "help": doc, "duration": duration})


@dataclass(frozen=True)
class Thresholds:
    """Alarm thresholds for a typical binary-classifier fine-tune (MISSION.md's table)."""

    poll: float = _th(30.0, "s", "seconds between polls of the metrics file", True)
    max_stall: float = _th(360.0, "s", "metrics file unmodified this long while the process lives: stall", True)
    startup_grace: float = _th(300.0, "s", "silence allowed before the first step record (tokenizing, loading weights)", True)
    hard_timeout: float = _th(10800.0, "s", "wall time since the watchdog started: timeout", True)
    min_auroc: float = _th(0.70, "AUROC", "eval AUROC below this after --min-auroc-step: stuck_auroc; at or below 1 - this: inverted_labels")
    min_auroc_step: int = _th(500, "steps", "warm-up before stuck_auroc applies")
    num_labels: int = _th(2, "classes", "chance loss is ln(num_labels); a start record's value is used when this is not given")
    chance_step: int = _th(400, "steps", "from this step a loss at chance is an alarm")
    chance_margin: float = _th(0.05, "fraction", "median loss within this fraction of ln(num_labels) counts as chance")
    grad_high: float = _th(50.0, "grad norm", "pre-clip grad norm above this for --sustain records: grad_explode")
    grad_low: float = _th(1e-3, "grad norm", "pre-clip grad norm below this for --sustain records: grad_collapse")
    converged_loss: float = _th(0.01, "loss", "grad_collapse stays quiet while the recent median loss is at or below this (a solved task has tiny gradients)")
    sustain: int = _th(5, "records", "consecutive step records a grad or throughput condition must hold")
    throughput_drop: float = _th(0.25, "fraction", "recent median sps this far below the baseline median: throughput")
    baseline_steps: int = _th(200, "steps", "step records up to this step form the throughput baseline")
    gpu_idle: float = _th(300.0, "s", "the run's GPUs below --gpu-idle-util this long after the startup grace: gpu_idle", True)
    gpu_idle_util: float = _th(5.0, "%", "GPU utilization under this counts as idle")

    @classmethod
    def from_dict(cls, d) -> "Thresholds":
        """Thresholds saved in a watchdog.json; unknown keys ignored, missing ones default."""
        return cls(**{k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__})

    @classmethod
    def describe(cls):
        """(name, default, unit, help, is_duration) for every threshold, in order."""
        for f in fields(cls):
            yield f.name, f.default, f.metadata["unit"], f.metadata["help"], f.metadata["duration"]


@dataclass(frozen=True)
class Process:
    """One watched process as a probe saw it. state: running|sleeping|stopped|zombie|gone|..."""

    pid: int
    state: str

    @property
    def alive(self) -> bool:
        return self.state not in ("gone", "zombie", "dead")


@dataclass(frozen=True)
class Window:
    """What one poll knows. Built by ``watch.py``; the rules only read it."""

    now: float                       # wall clock, s
    started: float                   # when watching began (or the process began, if earlier)
    watch_started: float             # when the watchdog itself started
    steps: tuple = ()                # the most recent step records, oldest first
    baseline_sps: tuple = ()         # sps of step records with step <= baseline_steps
    last_eval: Optional[dict] = None
    first_inverted: Optional[dict] = None   # the first eval with auroc <= 1 - min_auroc
    first_nonfinite: Optional[dict] = None  # the first step record with a non-finite value
    fatal: Optional[dict] = None
    last_step: int = 0
    metrics_mtime: Optional[float] = None
    processes: tuple = ()            # Process, one per watched pid
    log_tail: tuple = ()             # filtered last lines of the log (only read once dead)
    num_labels: int = 2
    gpu_util: Optional[float] = None # max utilization of the run's GPUs, %; None: no GPU
    gpu_idle_for: float = 0.0        # s the run's GPUs have been under the idle floor


@dataclass(frozen=True)
class Anomaly:
    kind: str
    step: int
    message: str


def anomaly(kind: str, what: str, step: int, fix: str) -> Anomaly:
    """The one message shape: ``ANOMALY <kind>: <what> at step N. <fix>.``"""
    assert kind in KINDS, kind
    return Anomaly(kind, step, f"ANOMALY {kind}: {what} at step {step}. {fix.rstrip('.')}.")


_msg = anomaly


def _g(x) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:.4g}"
    return repr(x) if isinstance(x, str) else str(x)


def _secs(x: float) -> str:
    return f"{x:.0f}s" if x >= 10 else f"{x:.1f}s"


def _died(w: Window) -> bool:
    return bool(w.processes) and any(not p.alive for p in w.processes)


def _nonfinite_field(rec: dict) -> Optional[str]:
    for name in ("loss", "grad_norm"):
        if name in rec and not is_finite(rec[name]):
            return name
    return None


def rule_nan(w: Window, th: Thresholds) -> Optional[Anomaly]:
    rec = w.first_nonfinite
    if rec is None:
        return None
    name = _nonfinite_field(rec) or "loss"
    value = rec.get(name)
    shown = "null" if value is None else _g(value) if isinstance(value, (int, float)) else repr(value)
    return _msg("nan", f"{name} = {shown} is not finite", int(rec.get("step", 0)),
                "Abort: lower the learning rate, check the inputs for NaN/Inf and keep gradient "
                "clipping on, then restart from the last good checkpoint")


def rule_fatal(w: Window, th: Thresholds) -> Optional[Anomaly]:
    rec = w.fatal
    if rec is None:
        return None
    return _msg("fatal", f"FATAL = {str(rec.get('FATAL'))[:200]!r} written", int(rec.get("step", w.last_step)),
                "The training script stopped itself: fix the reason it gives, then relaunch")


OOM_MARKERS = ("out of memory", "outofmemoryerror", "memoryerror", "std::bad_alloc",
               "can't allocate memory", "cannot allocate memory", "oom-kill", "cublas_status_alloc_failed")


def oom_line(lines) -> Optional[str]:
    """The last line of ``lines`` that names an out-of-memory error, or None."""
    return next((ln.strip() for ln in reversed(lines) if any(m in ln.lower() for m in OOM_MARKERS)), None)


def rule_oom(w: Window, th: Thresholds) -> Optional[Anomaly]:
    line = oom_line(w.log_tail) if _died(w) else None
    if line is None:
        return None
    return _msg("oom", f"log line = {line[:160]!r} after the process died", w.last_step,
                "Out of memory: halve the per-device batch size (keep the effective batch with "
                "gradient accumulation) or shorten the sequence length, then relaunch")


def last_error(lines) -> Optional[str]:
    """The last line of the last traceback in ``lines``, or None."""
    lines = [ln.rstrip() for ln in lines]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    body = [ln for ln in lines[starts[-1] + 1:] if ln.strip()]
    for ln in reversed(body):
        if not ln.startswith((" ", "\t")) and not ln.startswith("Traceback"):
            return ln.strip()
    return body[-1].strip() if body else None


def rule_crash(w: Window, th: Thresholds) -> Optional[Anomaly]:
    if not _died(w):
        return None
    err = last_error(w.log_tail)
    if err is None:
        return None
    return _msg("crash", f"last traceback line = {err[:200]!r} after the process died", w.last_step,
                "Fix that error (checkin.py shows the log tail), then relaunch from the last checkpoint")


def rule_dead(w: Window, th: Thresholds) -> Optional[Anomaly]:
    gone = [p for p in w.processes if not p.alive]
    if not gone:
        return None
    p = gone[0]
    return _msg("dead", f"pid {p.pid} = {p.state} != alive with no sentinel", w.last_step,
                "The trainer exited without writing its sentinel: read the end of train.log through "
                "checkin.py, then relaunch from the last checkpoint")


def rule_stall(w: Window, th: Thresholds) -> Optional[Anomaly]:
    stopped = [p for p in w.processes if p.state == "stopped"]
    if stopped:
        p = stopped[0]
        return _msg("stall", f"pid {p.pid} state = stopped != running", w.last_step,
                    f"The process is suspended (SIGSTOP or Ctrl-Z): resume it with kill -CONT {p.pid}, "
                    "or kill it and relaunch")
    if not w.steps or w.metrics_mtime is None or _died(w):
        return None
    age = w.now - max(w.metrics_mtime, w.watch_started)
    if age <= th.max_stall:
        return None
    return _msg("stall", f"metrics age = {_secs(age)} > {_secs(th.max_stall)}", w.last_step,
                "The process lives but writes nothing: py-spy dump --pid PID shows where it hangs "
                "(a dataloader worker, a collective, a lock); kill it and relaunch")


def rule_no_telemetry(w: Window, th: Thresholds) -> Optional[Anomaly]:
    if w.steps or w.fatal or w.first_nonfinite:
        return None
    waited = w.now - w.started
    if waited <= th.startup_grace:
        return None
    return _msg("no_telemetry", f"time without a step record = {_secs(waited)} > {_secs(th.startup_grace)}",
                w.last_step, "No step record yet: check that the script writes RUN_DIR/metrics.jsonl "
                "(the --out folder) and read train.log through checkin.py")


def rule_inverted_labels(w: Window, th: Thresholds) -> Optional[Anomaly]:
    rec = w.first_inverted
    if rec is None:
        return None
    return _msg("inverted_labels", f"eval_auroc = {_g(rec['eval_auroc'])} <= {_g(1 - th.min_auroc)}",
                int(rec.get("step", 0)), "The model ranks the classes backwards: the labels are "
                "inverted, flip them (label = 1 - label) or score the other class's probability")


def rule_stuck_auroc(w: Window, th: Thresholds) -> Optional[Anomaly]:
    rec = w.last_eval
    if rec is None or int(rec.get("step", 0)) < th.min_auroc_step:
        return None
    auroc = rec.get("eval_auroc")
    if is_finite(auroc) and auroc >= th.min_auroc:
        return None
    return _msg("stuck_auroc", f"eval_auroc = {_g(auroc)} < {_g(th.min_auroc)}", int(rec["step"]),
                "Still near chance after the warm-up: check the label column and the text/label "
                "alignment (a shuffled or constant label), then the learning rate")


def rule_chance_loss(w: Window, th: Thresholds) -> Optional[Anomaly]:
    recent = [r for r in w.steps[-th.sustain:] if is_finite(r.get("loss"))]
    if len(recent) < th.sustain or int(recent[-1].get("step", 0)) < th.chance_step:
        return None
    chance = math.log(max(w.num_labels, 2))
    med = statistics.median(r["loss"] for r in recent)
    if abs(med - chance) > th.chance_margin * chance:
        return None
    return _msg("chance_loss", f"median loss of the last {len(recent)} = {_g(med)} within "
                f"{th.chance_margin:.0%} of ln({w.num_labels}) = {chance:.4g}", int(recent[-1]["step"]),
                "The model predicts the prior: check that the learning rate is not 0 or tiny, the "
                "labels vary, and the loss sees the model's outputs")


def _sustained(w: Window, th: Thresholds, test: Callable[[float], bool]) -> Optional[list]:
    recent = w.steps[-th.sustain:]
    if len(recent) < th.sustain or th.sustain < 1:
        return None
    values = [r.get("grad_norm") for r in recent]
    if all(is_finite(v) and test(v) for v in values):
        return values
    return None


def rule_grad_explode(w: Window, th: Thresholds) -> Optional[Anomaly]:
    values = _sustained(w, th, lambda v: v > th.grad_high)
    if values is None:
        return None
    return _msg("grad_explode", f"grad_norm = {_g(min(values))} > {_g(th.grad_high)} for "
                f"{len(values)} records", int(w.steps[-1]["step"]),
                "Gradients are exploding: lower the learning rate (or lengthen the warm-up) and "
                "keep max_grad_norm=1.0, then restart from the last checkpoint")


def rule_grad_collapse(w: Window, th: Thresholds) -> Optional[Anomaly]:
    values = _sustained(w, th, lambda v: v < th.grad_low)
    if values is None:
        return None
    losses = [r["loss"] for r in w.steps[-th.sustain:] if is_finite(r.get("loss"))]
    if losses and statistics.median(losses) <= th.converged_loss:
        return None  # converged, not collapsed
    return _msg("grad_collapse", f"grad_norm = {_g(max(values))} < {_g(th.grad_low)} for "
                f"{len(values)} records", int(w.steps[-1]["step"]),
                "Gradients vanished: check for frozen parameters, a learning rate decayed to 0, "
                "or saturated outputs")


def rule_throughput(w: Window, th: Thresholds) -> Optional[Anomaly]:
    recent = w.steps[-th.sustain:]
    if len(recent) < th.sustain or not w.baseline_sps:
        return None
    if int(recent[0].get("step", 0)) <= th.baseline_steps:
        return None
    sps = [r.get("sps") for r in recent]
    if not all(is_finite(v) for v in sps):
        return None
    base = statistics.median(w.baseline_sps)
    floor = base * (1 - th.throughput_drop)
    med = statistics.median(sps)
    if base <= 0 or med >= floor:
        return None
    return _msg("throughput", f"median sps of the last {len(sps)} = {_g(med)} < {_g(floor)} "
                f"({th.throughput_drop:.0%} below the baseline {_g(base)})", int(recent[-1]["step"]),
                "Throughput collapsed: check nvidia-smi for another process or thermal throttling, "
                "a starved dataloader (num_workers), or swapping")


def rule_gpu_idle(w: Window, th: Thresholds) -> Optional[Anomaly]:
    if w.gpu_util is None or _died(w) or not w.processes:
        return None
    if w.now - w.started <= th.startup_grace or w.gpu_idle_for <= th.gpu_idle:
        return None
    return _msg("gpu_idle", f"GPU utilization = {w.gpu_util:.0f}% < {th.gpu_idle_util:g}% for "
                f"{_secs(w.gpu_idle_for)} > {_secs(th.gpu_idle)}", w.last_step,
                "The process lives but the GPU does nothing: a CPU-bound dataloader, a hang in a "
                "collective, or the model on the CPU; py-spy dump --pid PID shows which")


def rule_timeout(w: Window, th: Thresholds) -> Optional[Anomaly]:
    ran = w.now - w.watch_started
    if ran <= th.hard_timeout:
        return None
    return _msg("timeout", f"wall time = {_secs(ran)} > {_secs(th.hard_timeout)}", w.last_step,
                "The run outlived its window: stop it, keep the best checkpoint, and bench again "
                "before relaunching a shorter run")


RULES = {kind: globals()[f"rule_{kind}"] for kind in KINDS if f"rule_{kind}" in globals()}


def evaluate(w: Window, th: Thresholds, latched: Optional[dict] = None) -> Optional[Anomaly]:
    """The most specific anomaly that holds, or None. ``latched`` holds the findings of the
    record kinds (stuck_auroc, chance_loss, grad_*, throughput) made on the window ending at each
    new record, so they carry the first step that held whatever the poll interval."""
    for kind in KINDS:
        rule = RULES.get(kind)
        found = (latched or {}).get(kind) or (rule(w, th) if rule else None)
        if found is not None:
            return found
    return None

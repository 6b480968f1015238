"""The alarm thresholds: one frozen dataclass, every field a watchdog flag (``--max-stall`` for
``max_stall``) with its unit, default and meaning in its metadata, which ``--help`` and
references/thresholds.md are generated from. Standard library only: this is on the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from supervise.contract import is_finite


# What a threshold's flag accepts, declared on its field (``kind``): the watchdog's parser and the
# scan's fold key read it from here.
DURATION = "duration"        # seconds, or a number with s, m or h
FRACTION = "fraction"        # a number in (0, 1)
COUNT = "count"              # an integer >= 0
POSITIVE_INT = "positive_int"
POSITIVE = "positive"        # a number > 0
NONNEGATIVE = "nonnegative"  # a number > 0, or 0 (off)
SWITCH = "switch"            # a flag without a value
KINDS = (DURATION, FRACTION, COUNT, POSITIVE_INT, POSITIVE, NONNEGATIVE, SWITCH)


def _th(default, unit: str, doc: str, kind: str = "", folded: bool = True):
    """A threshold field: its unit, meaning and ``kind`` [a switch for a bool, a positive integer
    for an int, a positive number for a float]; ``folded``: a record rule reads it while folding
    the records (a scan folded under another value of it is another fold)."""
    kind = kind or (SWITCH if isinstance(default, bool) else POSITIVE_INT if isinstance(default, int) else POSITIVE)
    assert kind in KINDS, kind
    return field(default=default, metadata={"unit": unit, "help": doc, "kind": kind, "folded": folded})


@dataclass(frozen=True)
class Thresholds:
    """Alarm thresholds (the mission's table of healthy and alarm values, plus what real runs
    taught). Units in metadata: s (seconds), x (a factor), fraction, steps, records, ..."""

    poll: float = _th(30.0, "s", "seconds between polls of the metrics file", DURATION, folded=False)
    max_stall: float = _th(360.0, "s", "metrics file unmodified this long while the process lives: stall", DURATION, folded=False)
    min_stall: float = _th(45.0, "s", "the learned stall (--stall-factor x the longest gap between step records, or next to an eval while one is due) is never shorter than this; it also pads an announced pause (expect)", DURATION, folded=False)
    stall_factor: float = _th(5.0, "x", "once the run shows its rhythm (20 step records and an eval), a silence this many times its longest step gap is a stall, or its longest eval pause (the eval and a save after it) while an eval is due (benchmarks/stall_limit.py); 0 turns learning off", NONNEGATIVE, folded=False)
    hang_window: float = _th(20.0, "s", "a silent run whose every process's main-thread stack, sampled every poll (at most 5 s apart) once the silence passes max(the median step gap, 10s), stayed the same this long, idle (under a quarter of a core) or waiting in a collective, with every rank's innermost frame in a wait (a lock, an event, a queue, a socket, a collective, a DataLoader fetch, a sleep): stall, before the clock's limit; frames that move push the clock's limit out (references/hangs.md); 0 turns the frame evidence off (the clock alone)", NONNEGATIVE, folded=False)
    startup_grace: float = _th(300.0, "s", "silence allowed before the first step record (tokenizing, loading weights)", DURATION, folded=False)
    orphan_grace: float = _th(2.0, "s", "relaunch grace: what a watchdog finds at attach with no process of the run (an old sentinel, FATAL, first hit or traceback) is confirmed after this long, so that a relaunch started beside it can show", DURATION, folded=False)
    rank_grace: float = _th(10.0, "s", "one of several run processes gone this long while the others live: dead", DURATION, folded=False)
    hard_timeout: float = _th(0.0, "s", "wall time since the run started after which it is over: timeout; 0 takes the limit from the plan (the launcher's --window, else the start record's total_steps at the measured step rate x --timeout-margin), and no limit while neither is known", DURATION, folded=False)
    timeout_margin: float = _th(1.5, "x", "a run projected from its own step rate is over its plan after this many times the projection", folded=False)
    min_auroc: float = _th(0.70, "AUROC", "eval AUROC below this after --min-auroc-step: stuck_auroc; at or below 1 - this: inverted_labels", FRACTION)
    min_auroc_step: int = _th(500, "steps", "warm-up before stuck_auroc applies", COUNT)
    num_labels: int = _th(2, "classes", "chance loss is ln(num_labels); a start record's value is used when this is not given")
    chance_step: int = _th(400, "steps", "from this step a loss at chance is an alarm", COUNT)
    chance_margin: float = _th(0.05, "fraction", "median loss within this fraction of the chance loss counts as chance", FRACTION)
    diverge_factor: float = _th(10.0, "x", "median loss above this many times max(chance loss, the run's best median) for --sustain records: diverged")
    spike_factor: float = _th(2.0, "x", "loss above this many times the rolling mean of the --spike-window records before it, for --sustain records in a row: loss_spike")
    spike_window: int = _th(20, "records", "records in the rolling mean a loss spike is measured against")
    grad_high: float = _th(50.0, "grad norm", "pre-clip grad norm above this for --sustain records: grad_explode")
    grad_low: float = _th(1e-3, "grad norm", "pre-clip grad norm below this for --sustain records: grad_collapse")
    converged_loss: float = _th(0.01, "loss", "grad_collapse stays quiet while the recent median loss is at or below this (a solved task has tiny gradients)")
    sustain: int = _th(5, "records", "consecutive step records a loss, grad or throughput condition must hold")
    overfit_evals: int = _th(3, "evals", "eval loss rising this many evals in a row while the train loss falls: overfit (a check-in warning; an anomaly with --overfit-alarm)", COUNT)
    overfit_alarm: bool = _th(False, "switch", "make overfit an anomaly that ends the watch", folded=False)
    throughput_drop: float = _th(0.25, "fraction", "median sps this far below the baseline median for --throughput-window: throughput", FRACTION)
    throughput_window: float = _th(300.0, "s", "how long (record time) a throughput drop must hold", DURATION)
    warmup_steps: int = _th(20, "steps", "steps left out of the throughput baseline (compilation, cache warm-up)", COUNT)
    baseline_steps: int = _th(200, "steps", "step records up to this step form the throughput baseline", COUNT)
    straggler_ratio: float = _th(0.75, "fraction", "a rank whose sps stays below this fraction of the others' median for --throughput-window: straggler", FRACTION, folded=False)
    gpu_idle: float = _th(300.0, "s", "the run's GPUs below --gpu-idle-util this long after the startup grace: gpu_idle", DURATION, folded=False)
    gpu_idle_util: float = _th(5.0, "%", "GPU utilization under this counts as idle", folded=False)
    disk_margin: float = _th(1.5, "x", "the next checkpoint save (or the next repeated write on a volume of the run that frees nothing) needs this many times its measured bytes free on its file system: disk", folded=False)
    disk_min_saves: int = _th(5, "saves", "complete saves seen staying on disk (none deleted) before the run's remaining saves are projected against the free space; a rotation shows itself only at its limit, a declared save_total_limit at once", folded=False)
    disk_window: float = _th(3600.0, "s", "how long the free-space readings of each volume of the run (the run folder's, the log's, the checkpoint folders') are kept to measure its slope: the high-water mark of the oldest third against the newest third, so a save later deleted or a burst of writes then deleted moves nothing", DURATION)
    disk_horizon: float = _th(1800.0, "s", "a volume of the run that fills within this long at its measured slope, whatever fills it: disk", DURATION)
    disk_extrapolate: float = _th(1.0, "x", "the slope is trusted this many times as far ahead as the span it was measured over (at most --disk-horizon): at 1, a volume is disk when it would fill sooner than it has been seen filling")
    disk_free_min: float = _th(64.0, "MB", "a volume of the run with less free than this (at most a tenth of the volume) is full: disk while the run lives, and disk, not dead, when the trainer dies")

    @classmethod
    def from_dict(cls, d) -> "Thresholds":
        """Thresholds saved in a watchdog.json; unknown or wrong-typed values take the default."""
        if not isinstance(d, dict):
            return cls()
        good = {}
        for f in fields(cls):
            v = d.get(f.name)
            if isinstance(f.default, bool):
                if isinstance(v, bool):
                    good[f.name] = v
            elif is_finite(v) and v >= 0:
                good[f.name] = type(f.default)(v)
        return cls(**good)

    @classmethod
    def kind(cls, name: str) -> str:
        """What the threshold's flag accepts (``KINDS``)."""
        return next(f.metadata["kind"] for f in fields(cls) if f.name == name)

    @classmethod
    def folded(cls) -> tuple:
        """The thresholds a record rule reads while folding the records (``scan``'s fold key)."""
        return tuple(f.name for f in fields(cls) if f.metadata["folded"])

    @classmethod
    def describe(cls):
        """(name, default, unit, help, is_duration) for every threshold, in order."""
        for f in fields(cls):
            yield f.name, f.default, f.metadata["unit"], f.metadata["help"], f.metadata["kind"] == DURATION


def markdown(kinds, follows=()) -> str:
    """references/thresholds.md, generated from ``Thresholds`` and the rule table's ``kinds``
    (``judge.KINDS``; a test keeps the file equal to this text)."""
    rows = []
    for name, default, unit, doc, is_duration in Thresholds.describe():
        shown = "off" if default is False else f"{default:g}s" if is_duration else f"{default:g}"
        rows.append(f"| `--{name.replace('_', '-')}` | {shown} | {unit} | {doc} |")
    return "\n".join([
        "# Watchdog flags and thresholds",
        "",
        "Generated from `supervise.thresholds.Thresholds` and `supervise.judge.table.RULES` (`python -c \"from "
        "supervise.judge.table import KINDS; from supervise.observe.engines import follow_flags; from "
        "supervise.thresholds import markdown; print(markdown(KINDS, follow_flags()), end='')\" "
        "> references/thresholds.md`); a test fails when it drifts.",
        "",
        "`python scripts/watchdog.py RUN_DIR [flags]`. Durations take seconds or `90s`, `6m`, `3h`.",
        "Exit 0: `OK done: ...`; exit 7: `ANOMALY <kind>: ...`; exit 2: bad usage (one line);",
        "SIGTERM/SIGINT/SIGHUP: `STOPPED: watchdog ended by SIGTERM ...`, exit 0, state saved.",
        "",
        "Other flags (not thresholds):",
        "",
        "| flag | meaning |",
        "| --- | --- |",
        "| `--pid PID` | a training process to watch (repeatable); default: the start record's pid and every process writing the log |",
        "| `--log PATH` | the training log (default `RUN_DIR/train.log`) |",
        "| `--sentinel NAME` | the completion sentinel, a file name in RUN_DIR (default `final_val_metrics.json`) |",
        *(f"| `{flag} ID` | {what} |" for flag, what in follows),
        "| `--checkpoint-dir DIR` | a folder of checkpoints for the disk rule (repeatable); default: the start record's `checkpoint_dir`, else `RUN_DIR/checkpoints` |",
        "| `--detach` | start detached (own session, its line appended to `RUN_DIR/watchdog.log`) and return at once: for a session that ends |",
        "| `--on-exit CMD` | a shell command run once, detached, when the watchdog ends, with `SUPERVISE_VERDICT`, `SUPERVISE_KIND`, `SUPERVISE_EXIT_CODE`, `SUPERVISE_RUN_DIR`, `SUPERVISE_SESSION_ID` set (references/session.md) |",
        "| `--heartbeat-url URL` | a dead-man's switch, healthchecks-style: a GET every minute while the watchdog lives and `URL/<exit code>` with the verdict; a failed ping is one line in the log |",
        "| `--from-now` | judge only what is written after this watchdog starts: the watch-on line after `throughput`, `straggler`, `gpu_idle` (references/recovery.md) |",
        "| `--no-stacks`, `--native-stacks` | on a hang take no stacks, or C/C++ frames too (`py-spy dump --native`); by default they go to `RUN_DIR/stacks/` (references/hangs.md) |",
        "",
        "Thresholds:",
        "",
        "| flag | default | unit | meaning |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "Kinds, most specific first (when several hold in one poll, the first is reported): "
        + ", ".join(f"`{k}`" for k in kinds) + ".",
        "Record kinds report the first step where they held, whatever the poll interval. `overfit` is a",
        "check-in warning unless `--overfit-alarm` is given. With no GPU or no NVML, `gpu_idle` is off",
        "and `watchdog.json` says so.",
        "",
    ])

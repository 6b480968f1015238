"""The words every module shares, on the ground floor: the run folder's file names, the exit
codes, the quiet environment of a training launch, the states of a process that is gone, and
the one shape of an anomaly. Nothing here reads a file or imports another module of the package.

Exit codes (every script): 0 healthy / done / passed; 7 anomaly (watchdog) or check failed
(smoke); 2 bad usage or unreadable input, with one line saying what and how to fix.

An anomaly's message has one shape, ``ANOMALY <kind>: <what> at step N. <fix>.``, where
``<what>`` reads ``<name> = <value> <op> <threshold>``; the kinds are the rows of
``judge.RULES`` (lower_snake_case words).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------- the run folder
PACKAGE = Path(__file__).resolve().parent   # the library package (supervise/)
BUNDLE = PACKAGE.parent                       # the skill bundle: scripts/, templates/, SKILL.md

METRICS = "metrics.jsonl"            # the telemetry contract (the training script)
SENTINEL = "final_val_metrics.json"  # the completion sentinel (the training script, last)
LOG = "train.log"                    # the trainer's stdout and stderr (the launcher appends)
WATCHDOG_STATE = "watchdog.json"     # the watchdog's state, each poll (state.WatchState)
SCAN_STATE = ".scan.json"            # what a scan of metrics.jsonl learned, beside it (scan.Scan)
WATCHDOG_LOG = "watchdog.log"        # a detached watchdog's one line
LAUNCH = "launch.json"               # the launches of the folder (state.read_launch)
ON_EXIT_LOG = "on_exit.log"          # what --on-exit commands printed
HPARAMS = "hparams.json"             # the templates' hyper-parameters
CHECKPOINTS = "checkpoints"          # the default checkpoint folder

# ---------------------------------------------------------------------------- exit codes
EXIT_OK, EXIT_USAGE, EXIT_ANOMALY = 0, 2, 7

# ---------------------------------------------------------------------------- a training launch
# What a training launch needs set: no progress bars burying the error, no tokenizer fork warnings
QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
ENV = {"PYTHONUNBUFFERED": "1", **QUIET}
PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")   # an interpreter's name or path

# ---------------------------------------------------------------------------- the next move
# What follows an alarm: one per kind in judge.RULES's ``move`` column (references/recovery.md).
RELAUNCH = "relaunch"      # resume from the last good checkpoint with the kind's change (lr, batch)
AS_IS = "as_is"            # transient (a signal, a preemption, a lost node, a hang): resume the same command
WATCH_ON = "watch_on"      # a relaunch does not fix it and the trainer still makes progress: a new watchdog
FIX_FIRST = "fix_first"    # no relaunch line until what the line names is fixed
STOP_ASK = "stop_ask"      # the run learns nothing useful: stop it, ask, and a fresh-folder line to approve
MOVES = (RELAUNCH, AS_IS, WATCH_ON, FIX_FIRST, STOP_ASK)

# ---------------------------------------------------------------------------- processes
# The states of a verdict (Verdict.state, watchdog.json's state): watching and finishing while the
# watch goes on, one of FINAL when it ends.
WATCHING, FINISHING, DONE, ANOMALY, STOPPED = "watching", "finishing", "done", "anomaly", "stopped"
GOING_ON = (WATCHING, FINISHING)
FINAL = (DONE, ANOMALY, STOPPED)
GONE = ("gone", "zombie", "dead")    # process states that are no longer a running process


# ---------------------------------------------------------------------------- anomalies
@dataclass(frozen=True)
class Anomaly:
    kind: str
    step: int
    message: str


KIND = re.compile(r"^[a-z][a-z_]*$")


def anomaly(kind: str, what: str, step: int, fix: str) -> Anomaly:
    """The one message shape: ``ANOMALY <kind>: <what> at step N. <fix>.``"""
    assert KIND.match(kind), kind
    return Anomaly(kind, step, f"ANOMALY {kind}: {what} at step {step}. {fix.rstrip('.')}.")


def shown(x) -> str:
    """A value as a message shows it: floats to 4 significant digits (nan and inf spelled out),
    strings quoted."""
    if isinstance(x, float):
        return str(x) if not math.isfinite(x) else f"{x:.4g}"
    return repr(x) if isinstance(x, str) else str(x)


def secs(x: float) -> str:
    """Seconds as a message shows them: ``42s``, ``3.5s``."""
    return f"{x:.0f}s" if x >= 10 else f"{x:.1f}s"


def ranks_text(nums) -> str:
    """Rank numbers as runs: [0, 1, 2, 3, 4, 5, 7, 9, 10, 11, 12] -> '0-5,7,9-12'."""
    nums = sorted(set(nums))
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)

"""The procedure end to end on the shipped task, each step through the real script: bench, audit
(a small code corpus cut from this Python's standard library, with broken rows), smoke, the
detached launch of the torch template through the launcher (as SKILL.md step 5 says), the
watchdog beside it, check-ins while it runs, the PNG, and the watchdog's final line. ``--fault dead|nan|inverted`` injects a real fault
(SIGKILL, a diverging learning rate, flipped eval labels) and shows the watchdog's exit 7. Each
step is labelled with its number in SKILL.md (1-8)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from supervise.tools.checkin import summary
from supervise.cli import Parser, UsageError, duration, front_door
from supervise.contract import is_finite, read_json
from supervise.tools.plot import plot as plot_png
from supervise.observe.state import launch_alive, read_launch
from supervise.act.stop import stop
from supervise.vocabulary import BUNDLE as ROOT, EXIT_ANOMALY, EXIT_OK, METRICS, QUIET as GUARD_QUIET, SENTINEL

TEMPLATE = "train_torch.py"
QUIET = {"PYTHONUNBUFFERED": "1", **GUARD_QUIET}  # what the launch hooks ask of a training launch
MARKER = ".supervise-demo"  # written into every folder the demo creates: only those may it remove


def check_claim(folder: Path) -> None:
    """Refuse (UsageError) what the demo may not own: an empty path, a file, a symlink, or a folder
    holding anything the demo did not write (no MARKER inside). Touches nothing."""
    if not str(folder) or str(folder) in (".", "/"):
        raise UsageError(f"--out {str(folder)!r} is not a folder the demo can own; give a new folder, e.g. runs/demo")
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise UsageError(f"{folder} is {'a symlink' if folder.is_symlink() else 'a file'}; give a new folder for "
                         "the demo, e.g. runs/demo")
    if folder.is_dir():
        try:
            inside = os.listdir(folder)
        except OSError as e:
            raise UsageError(f"cannot read {folder}: {e.strerror}; give a new folder, e.g. runs/demo")
        if inside and MARKER not in inside:
            raise UsageError(f"{folder} holds files the demo did not write ({len(inside)} entries, no {MARKER}); "
                             "give a new or empty folder, e.g. runs/demo")


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def claim(folder: Path) -> None:
    """Make ``folder`` the demo's own, empty, with MARKER inside; an earlier demo folder (MARKER
    present) is removed first. Call ``check_claim`` on every folder before claiming any."""
    check_claim(folder)
    try:
        if folder.is_dir() and os.listdir(folder):
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARKER).write_text("made by scripts/demo.py: the demo may remove this folder on its next run\n")
    except OSError as e:
        raise UsageError(f"cannot make {folder} the demo's folder: {e.strerror}; give a new writable folder")


def flipped_data(run_dir: Path) -> list[str]:
    """A train CSV and an eval CSV whose labels are flipped: the bug the watchdog must name."""
    import pandas as pd
    spec = importlib.util.spec_from_file_location("train_torch", ROOT / "templates" / TEMPLATE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    texts, labels = mod.generated_task(4600, 1)
    pd.DataFrame({"text": texts[:4000], "label": labels[:4000]}).to_csv(run_dir / "train.csv", index=False)
    pd.DataFrame({"text": texts[4000:], "label": [1 - y for y in labels[4000:]]}).to_csv(run_dir / "eval.csv", index=False)
    return ["--data", str(run_dir / "train.csv"), "--eval-data", str(run_dir / "eval.csv"), "--epochs", "3"]


def fault_args(fault, run_dir: Path) -> list[str]:
    """The trainer's extra words for ``--fault``: a diverging learning rate for nan, flipped data for
    inverted (written only then), none for dead (a SIGKILL later) or no fault."""
    if fault == "nan":
        return ["--lr", "1e4"]
    if fault == "inverted":
        return flipped_data(run_dir)
    return []


def step(title: str, cmd: list[str]) -> int:
    """Run one step of the procedure through its real script and show what it printed."""
    say(f"{title}: {' '.join(cmd)}")
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **QUIET})
    for line in p.stdout.strip().splitlines():
        print(f"    {line}", flush=True)
    return p.returncode


def code_corpus(path: Path, n: int = 400) -> None:
    """Top-level functions of a few standard-library modules, plus the rows a scrape holds."""
    import json
    import re
    rows = []
    for mod in ("json/decoder.py", "json/encoder.py", "textwrap.py", "shlex.py", "fnmatch.py"):
        text = (Path(os.__file__).parent / mod).read_text()
        starts = [m.start() for m in re.finditer(r"^(?:@.*\n)*(?:def|class) ", text, re.M)]
        rows += [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    rows = rows[:n] + ['print "python 2"\n', "def truncated(a,\n", "function js() { return 1; }\n", "x = 1\x00\n"]
    with open(path, "w") as f:
        for i, code in enumerate(rows):
            f.write(json.dumps({"id": i, "code": code}) + "\n")


def _seconds(value: float) -> str:
    """A duration flag for the scripts: '600s', '0.5s' (never an exponent, which they refuse)."""
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


def main(argv=None) -> int:
    p = Parser(prog="demo.py", description=__doc__)
    p.add_argument("--out", default="runs/demo", help="run directory [runs/demo]")
    p.add_argument("--fault", choices=["dead", "nan", "inverted"], help="inject a real fault")
    p.add_argument("--poll", type=duration, default=2.0, help="watchdog poll interval [2s]")
    p.add_argument("--window", type=duration, default=600.0,
                   help="the GPU window that bench and smoke project the run against [10m]; a busy machine needs more")
    return front_door(p, _main, argv)


def _main(a) -> int:
    if not a.out.strip():
        raise UsageError("--out is empty; give a new folder for the demo run, e.g. runs/demo")
    run_dir = Path(a.out)
    smoke_dir = run_dir.parent / (run_dir.name + "-smoke")
    for folder in (run_dir, smoke_dir):
        check_claim(folder)
    for folder in (run_dir, smoke_dir):
        claim(folder)
    window = _seconds(a.window)
    py, scripts, template = sys.executable, ROOT / "scripts", str(ROOT / "templates" / TEMPLATE)
    say(f"1. telemetry: templates/{TEMPLATE} writes the contract to RUN_DIR/{METRICS}")
    step("2. bench", [py, str(scripts / "bench.py"), "--config", "tiny", "--seq-len", "32", "--batch", "32",
                      "--samples", "6000", "--epochs", "2", "--eval-samples", "600", "--window", window])
    code_corpus(run_dir / "corpus.jsonl")
    step("3. audit", [py, str(scripts / "audit.py"), str(run_dir / "corpus.jsonl"), "--id-col", "id",
                      "--normalize", "ast", "--out", str(run_dir / "audited")])
    if step("4. smoke", [py, str(scripts / "smoke.py"), str(smoke_dir), "--full-samples", "6000", "--epochs", "2",
                         "--window", window, "--", py, "-u", template, "--out", str(smoke_dir), "--smoke"]) != 0:
        say("smoke failed: stop here, as the procedure says")
        return EXIT_ANOMALY
    extra = fault_args(a.fault, run_dir)
    cmd = [py, str(scripts / "launch.py"), str(run_dir), "--window", window, "--", py, "-u", template,
           "--out", str(run_dir), *extra]
    if step("5. launch, one line, detached", cmd) != 0:
        say("the launcher refused: stop here")
        return EXIT_ANOMALY
    trainer = read_launch(run_dir)["pid"]
    wd_cmd = [py, "-u", str(scripts / "watchdog.py"), str(run_dir), "--poll", _seconds(a.poll)]
    say("6. watchdog: " + " ".join(wd_cmd))
    watchdog = subprocess.Popen(wd_cmd, stdout=subprocess.PIPE, text=True)
    killed = False
    try:
        while watchdog.poll() is None:
            time.sleep(3)
            if watchdog.poll() is not None:
                break
            say("7. check-in:\n" + summary(run_dir))
            metrics = run_dir / METRICS
            if a.fault == "dead" and not killed and metrics.exists() and b"eval_auroc" in metrics.read_bytes():
                say(f"fault: kill -9 {trainer}")
                os.kill(trainer, signal.SIGKILL)  # detached: init reaps it, as after a real kill
                killed = True
        verdict = watchdog.stdout.read().strip()
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
        watchdog.wait()
        if launch_alive(read_launch(run_dir)):
            stop(run_dir, grace_s=5.0)
    say(f"watchdog exited {watchdog.returncode}: {verdict}")
    say(f"snapshot: {plot_png(run_dir)}")
    final = read_json(run_dir / SENTINEL)
    if isinstance(final, dict):
        say("final_val_metrics.json: " + " ".join(f"{k}={final[k]:.4f}" for k in ("eval_auroc", "eval_acc")
                                                  if is_finite(final.get(k))))
    if a.fault:
        say("8. recover: after an anomaly, run check-in's next: lines as they are (SKILL.md step 8)")
    expected = EXIT_ANOMALY if a.fault else EXIT_OK
    return EXIT_OK if watchdog.returncode == expected else EXIT_ANOMALY

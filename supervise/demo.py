"""The procedure end to end on the shipped task: launch the HF template in the background, the
watchdog beside it, check in while it runs, and report the watchdog's verdict.
``--fault dead|nan|inverted`` injects a real fault and shows the watchdog's exit 7."""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .cli import EXIT_ANOMALY, EXIT_OK, Parser
from .contract import METRICS, SENTINEL, read_json, tail_lines

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
         "TOKENIZERS_PARALLELISM": "false"}


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def flipped_data(run_dir: Path) -> list[str]:
    """A train CSV and an eval CSV whose labels are flipped: the bug the watchdog must name."""
    import pandas as pd
    spec = importlib.util.spec_from_file_location("train_hf", ROOT / "templates" / "train_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    texts, labels = mod.generated_task(4600, 1)
    pd.DataFrame({"text": texts[:4000], "label": labels[:4000]}).to_csv(run_dir / "train.csv", index=False)
    pd.DataFrame({"text": texts[4000:], "label": [1 - y for y in labels[4000:]]}).to_csv(run_dir / "eval.csv", index=False)
    return ["--data", str(run_dir / "train.csv"), "--eval-data", str(run_dir / "eval.csv"), "--epochs", "3"]


def checkin(run_dir: Path) -> str:
    try:
        from .checkin import summary
        return summary(run_dir)
    except ImportError:
        last = tail_lines(run_dir / METRICS, 1)
        return last[-1].decode(errors="replace") if last else "(no metrics yet)"


def main(argv=None) -> int:
    p = Parser(prog="demo.py", description=__doc__)
    p.add_argument("--out", default="runs/demo", help="run directory [runs/demo]")
    p.add_argument("--fault", choices=["dead", "nan", "inverted"], help="inject a real fault")
    p.add_argument("--poll", default="2", help="watchdog poll interval [2s]")
    a = p.parse_args(argv)
    run_dir = Path(a.out)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    extra = {"nan": ["--lr", "1e20", "--warmup-steps", "0"], "inverted": flipped_data(run_dir)}.get(a.fault, [])
    cmd = [sys.executable, "-u", str(ROOT / "templates" / "train_hf.py"), "--out", str(run_dir), *extra]
    say("launch: " + " ".join(f"{k}={v}" for k, v in QUIET.items()) + " " + " ".join(cmd[:1] + cmd[1:]) +
        f" > {run_dir}/train.log 2>&1")
    with open(run_dir / "train.log", "wb") as log:
        trainer = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **QUIET})
    wd_cmd = [sys.executable, "-u", str(ROOT / "scripts" / "watchdog.py"), str(run_dir), "--pid", str(trainer.pid),
              "--poll", a.poll]
    say("watchdog: " + " ".join(wd_cmd))
    watchdog = subprocess.Popen(wd_cmd, stdout=subprocess.PIPE, text=True)
    killed = False
    try:
        while watchdog.poll() is None:
            time.sleep(3)
            if watchdog.poll() is not None:
                break
            say("check-in:\n" + checkin(run_dir))
            metrics = run_dir / METRICS
            if a.fault == "dead" and not killed and metrics.exists() and b"eval_auroc" in metrics.read_bytes():
                say(f"fault: kill -9 {trainer.pid}")
                trainer.send_signal(signal.SIGKILL)
                killed = True
        verdict = watchdog.stdout.read().strip()
    finally:
        for proc in (trainer, watchdog):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    say(f"watchdog exited {watchdog.returncode}: {verdict}")
    final = read_json(run_dir / SENTINEL)
    if final:
        say(f"final_val_metrics.json: eval_auroc={final.get('eval_auroc'):.4f} eval_acc={final.get('eval_acc'):.4f}")
    expected = EXIT_ANOMALY if a.fault else EXIT_OK
    return EXIT_OK if watchdog.returncode == expected else EXIT_ANOMALY

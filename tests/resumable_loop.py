"""A user's plain training loop with the documented bare-python integration (Telemetry, a declared
``--resume {checkpoint}`` recipe, a checkpoint every --save-every steps), standard library only.

    python -u tests/resumable_loop.py --out RUN [--lr 0.01] [--steps 300] [--nan-at 60] [--nan-lr 0.008]
        [--raise-at 120 [--raise-once] [--error "ValueError: bad row 7"]] [--auroc 0.5] [--slow-from 150 --slow-dt 0.2]

The fault is the one a too-high learning rate makes: from step --nan-at the loss is NaN while the
learning rate is above --nan-lr (so the relaunch at half the rate gets past it; --nan-lr 0 fails
at every rate). Telemetry raises on the NaN and writes its FATAL record first. --raise-at raises
--error from the loop at that step (a bug: every attempt; --raise-once: only an attempt that did not
resume, a transient failure); --auroc keeps every eval's AUROC there (a model that learns nothing);
--slow-from makes every step from there take --slow-dt seconds (a throughput drop).
"""
import argparse
import json
import math
import os
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervise.telemetry import Telemetry  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--steps", type=int, default=300)
p.add_argument("--save-every", type=int, default=50)
p.add_argument("--dt", type=float, default=0.05, help="seconds per step")
p.add_argument("--resume", default=None, help="a checkpoint to continue from")
p.add_argument("--nan-at", type=int, default=None)
p.add_argument("--nan-lr", type=float, default=0.008)
p.add_argument("--raise-at", type=int, default=None)
p.add_argument("--raise-once", action="store_true")
p.add_argument("--error", default="ValueError: bad row 7 in shard 3")
p.add_argument("--auroc", type=float, default=None)
p.add_argument("--slow-from", type=int, default=None)
p.add_argument("--slow-dt", type=float, default=0.2)
a = p.parse_args()

ckpt_dir = os.path.join(a.out, "checkpoints")
os.makedirs(ckpt_dir, exist_ok=True)
first = 1
if a.resume:
    with zipfile.ZipFile(a.resume) as z:
        first = json.loads(z.read("state.json"))["step"] + 1
print(f"training from step {first} at lr {a.lr}", flush=True)


def save(step: int) -> None:
    """A checkpoint the checkpoint check trusts (a zip, like torch.save's), renamed into place."""
    tmp = os.path.join(ckpt_dir, f".tmp.step-{step}.pt")
    with zipfile.ZipFile(tmp, "w") as z:
        z.writestr("state.json", json.dumps({"step": step, "lr": a.lr}))
    os.replace(tmp, os.path.join(ckpt_dir, f"step-{step}.pt"))


with Telemetry(a.out, task="classification", num_labels=2, total_steps=a.steps, batch_size=8,
               resume=["--resume", "{checkpoint}"], checkpoint_dir=ckpt_dir, flags={"--lr": a.lr}) as tm:
    for step in range(first, a.steps + 1):
        time.sleep(a.slow_dt if a.slow_from is not None and step >= a.slow_from else a.dt)
        if step == a.raise_at and not (a.raise_once and a.resume):
            name, _, text = a.error.partition(": ")
            raise {"ValueError": ValueError, "RuntimeError": RuntimeError, "OSError": OSError}[name](text)
        loss = 0.69 * math.exp(-step / 100) + 0.05
        if a.nan_at is not None and step >= a.nan_at and a.lr > a.nan_lr:
            loss = float("nan")
        if step % 10 == 0:
            tm.step(step, loss, lr=a.lr, grad_norm=1.0)
        if step % a.save_every == 0:
            save(step)
            tm.eval(step, auroc=a.auroc if a.auroc is not None else min(0.99, 0.6 + step / 500), loss=loss)
    tm.done(eval_auroc=0.99)

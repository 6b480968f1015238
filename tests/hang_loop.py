"""A training loop that hangs for real, the way users' runs do (tests/test_stacks.py).

    python tests/hang_loop.py RUN_DIR --mode plain  --hang-at 8    # Telemetry; blocks in fetch_shard()
    python tests/hang_loop.py RUN_DIR --mode loader --hang-at 8    # a DataLoader (num_workers=2) whose __getitem__ blocks
    python tests/hang_loop.py RUN_DIR --mode bare   --hang-at 8    # no integration: records written by hand
    python tests/hang_loop.py RUN_DIR --mode save   --hang-at 30   # evals at 10 and 20; torch.save that never ends

Each step record is written every --dt seconds; at step --hang-at the loop blocks forever in the
user's own function (a queue nobody fills), as a shard download or a lock would.
"""
import argparse
import json
import os
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fetch_shard(step, hang_at):
    if step == hang_at:
        queue.Queue().get()   # nobody ever puts: the plain loop's hang
    return step


def plain(a):
    from supervise.telemetry import Telemetry
    with Telemetry(a.run_dir, total_steps=1000, batch_size=8) as tm:
        for step in range(1, 1001):
            fetch_shard(step, a.hang_at)
            time.sleep(a.dt)
            tm.step(step, 0.5, lr=0.1, grad_norm=1.0)


def bare(a):
    """No integration: a script that writes the contract itself (the py-spy path)."""
    out = os.open(os.path.join(a.run_dir, "metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    t0 = time.time()
    os.write(out, (json.dumps({"event": "start", "t": 0, "pid": os.getpid(), "time": t0}) + "\n").encode())
    for step in range(1, 1001):
        fetch_shard(step, a.hang_at)
        time.sleep(a.dt)
        os.write(out, (json.dumps({"step": step, "t": round(time.time() - t0, 3), "loss": 0.5}) + "\n").encode())


class Shards:
    """A dataset whose item ``hang_item`` never arrives (a worker stuck on a read)."""

    def __init__(self, hang_item):
        self.hang_item = hang_item

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        if i == self.hang_item:
            queue.Queue().get()   # the worker's hang: a read that never returns
        time.sleep(0.001)
        return i


def loader(a):
    import torch
    from torch.utils.data import DataLoader
    from supervise.telemetry import Telemetry
    data = DataLoader(Shards(a.hang_at * 4), batch_size=4, num_workers=2, collate_fn=torch.tensor)
    with Telemetry(a.run_dir, total_steps=1000, batch_size=4) as tm:
        for step, batch in enumerate(data, start=1):
            time.sleep(a.dt)
            tm.step(step, float(batch.float().mean()) / 1e4, lr=0.1, grad_norm=1.0)


def save(a):
    """A slow checkpoint save (torch.save into a pipe nobody reads: it never ends), not on an eval."""
    import torch
    from supervise.telemetry import Telemetry
    fifo = os.path.join(a.run_dir, "ckpt.fifo")
    os.mkfifo(fifo)

    def save_checkpoint(step):
        torch.save({"step": step}, fifo)

    with Telemetry(a.run_dir, total_steps=1000, batch_size=8) as tm:
        for step in range(1, 1001):
            if step == a.hang_at:
                save_checkpoint(step)
            time.sleep(a.dt)
            tm.step(step, 0.5, lr=0.1, grad_norm=1.0)
            if step % 10 == 0:
                tm.eval(step, loss=0.4)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--mode", choices=("plain", "loader", "bare", "save"), default="plain")
    p.add_argument("--hang-at", type=int, default=8)
    p.add_argument("--dt", type=float, default=0.05)
    a = p.parse_args()
    os.makedirs(a.run_dir, exist_ok=True)
    print(f"pid {os.getpid()} mode {a.mode}", flush=True)
    {"plain": plain, "bare": bare, "loader": loader, "save": save}[a.mode](a)


if __name__ == "__main__":
    main()

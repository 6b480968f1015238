"""A plain torch.distributed (gloo, CPU) training loop with supervise.telemetry.Telemetry.

    torchrun --nproc_per_node 2 tests/ddp_loop.py --out RUN_DIR >> RUN_DIR/train.log 2>&1

Every rank appends its heartbeat to RUN_DIR/ranks/rank-<N>.jsonl each --log-every steps
(contract v0.2); rank 0 also writes RUN_DIR/metrics.jsonl and, last, the sentinel
RUN_DIR/final_val_metrics.json.
``--raise-rank R --raise-step S`` makes rank R raise at step S (a real traceback, recorded by
torchelastic's @record into TORCHELASTIC_ERROR_FILE). ``--hang-rank R --hang-step S``: each step
also all-reduces a loss total explicitly, and at step S rank R blocks forever in ``load_shard()``
before it, so the other ranks wait in that ``all_reduce`` for a rank that never reaches it.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from supervise.telemetry import Telemetry  # noqa: E402


def load_shard(rank, step, a):
    if rank == a.hang_rank and step == a.hang_step:
        queue.Queue().get()   # a read that never returns: this rank never reaches the all_reduce


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step")
    ap.add_argument("--log-every", type=int, default=2)
    ap.add_argument("--raise-rank", type=int, default=-1)
    ap.add_argument("--raise-step", type=int, default=10)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=10)
    ap.add_argument("--no-record", action="store_true", help="without torchelastic's @record")
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print(f"rank {rank}/{world} pid {os.getpid()} started", flush=True)
    with Telemetry(a.out, task="classification", num_labels=2, total_steps=a.steps, batch_size=8) as tm:
        for step in range(1, a.steps + 1):
            if rank == a.raise_rank and step == a.raise_step:
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # the gloo all-reduce: every rank waits for the others here
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if a.hang_rank >= 0:
                load_shard(rank, step, a)
                total = loss.detach().clone()
                dist.all_reduce(total)   # the ranks meet here every step
            time.sleep(a.step_time)
            if step % a.log_every == 0:
                tm.step(step, loss.item(), lr=0.1, grad_norm=gn.item())
        dist.barrier()
        tm.done(step=a.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    (main if "--no-record" in sys.argv else record(main))()

"""A user's Ray Train job (TorchTrainer, gloo on CPU) with the bare-python integration on rank 0:
one step record every --dt seconds, the sentinel at the end.

    python tests/ray_train_job.py --out RUN [--steps 40] [--dt 0.3] [--workers 2] [--resource worker]
        [--max-failures 0] [--raise-at 5 [--raise-once]] [--hold-file F]

--resource: the custom resource each worker needs (one unit), so that the test chooses the node the
workers land on; --raise-at raises from every worker at that step (--raise-once: only in the first
attempt, a transient failure that Ray Train's restart gets past); --hold-file: a restarted attempt
waits at its first step until that file exists (so a check-in can see the restart note).
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray.train  # noqa: E402
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--dt", type=float, default=0.3)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--resource", default="worker")
p.add_argument("--max-failures", type=int, default=0)
p.add_argument("--raise-at", type=int, default=None)
p.add_argument("--raise-once", action="store_true")
p.add_argument("--hold-file", default=None)
a = p.parse_args()


def loop(cfg):
    import torch.distributed as dist
    from supervise.telemetry import Telemetry
    rank = ray.train.get_context().get_world_rank()
    marker = os.path.join(cfg["out"], ".attempt-raised")
    restarted = os.path.exists(marker)
    tel = Telemetry(cfg["out"], total_steps=cfg["steps"], rank=0) if rank == 0 else None
    for step in range(1, cfg["steps"] + 1):
        time.sleep(cfg["dt"])
        dist.barrier()
        if restarted and cfg["hold"]:
            while not os.path.exists(cfg["hold"]):
                time.sleep(0.2)
        if cfg["raise_at"] == step and not (cfg["raise_once"] and restarted):
            if rank == 0:
                Path(marker).touch()
            raise ValueError(f"bad row {step} in shard 3")
        if tel:
            tel.step(step, loss=1.0 / step, lr=1e-3)
    if tel:
        tel.done(eval_loss=0.5)


trainer = TorchTrainer(
    loop,
    train_loop_config={"out": os.path.abspath(a.out), "steps": a.steps, "dt": a.dt, "raise_at": a.raise_at,
                       "raise_once": a.raise_once, "hold": a.hold_file},
    scaling_config=ScalingConfig(num_workers=a.workers, resources_per_worker={"CPU": 1, a.resource: 1}),
    run_config=RunConfig(name=f"train-{os.path.basename(a.out)}", storage_path=os.path.join(a.out, "ray"),
                         failure_config=FailureConfig(max_failures=a.max_failures)))
trainer.fit()
print("fit done", flush=True)

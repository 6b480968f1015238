"""A trainer stand-in that fills a disk the way a real one does: every --every seconds it saves an
HF-layout checkpoint (checkpoint-N/model.safetensors of --mb MB through the safetensors package,
then trainer_state.json, then the Trainer's rotation: the oldest beyond --keep deleted; 0 keeps
all), and writes the telemetry contract (a start record with total_steps and checkpoint_dir, a
step record per save) to RUN_DIR/metrics.jsonl. A failed save prints its traceback (train.log)
and exits 1, as a trainer does.

    python tests/ckpt_writer.py RUN_DIR --ckpt-dir DIR [--every 1] [--mb 6] [--keep 0] [--saves 20]
"""
import argparse
import json
import os
import shutil
import sys
import time
import traceback

import numpy as np
from safetensors.numpy import save_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--resume_from_checkpoint", default=None, help="its resume recipe (a checkpoint-N folder)")
    p.add_argument("run_dir")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--every", type=float, default=1.0)
    p.add_argument("--mb", type=float, default=6.0)
    p.add_argument("--keep", type=int, default=0)
    p.add_argument("--saves", type=int, default=20)
    p.add_argument("--steps-per-save", type=int, default=10)
    a = p.parse_args()
    os.makedirs(a.run_dir, exist_ok=True)
    os.makedirs(a.ckpt_dir, exist_ok=True)
    total = a.saves * a.steps_per_save
    weights = {"w": np.ones(int(a.mb * 1e6 / 4), dtype=np.float32)}
    t0 = time.time()
    with open(os.path.join(a.run_dir, "metrics.jsonl"), "a") as m:
        def record(rec):
            m.write(json.dumps(rec) + "\n")
            m.flush()

        record({"event": "start", "t": 0, "pid": os.getpid(), "total_steps": total, "num_labels": 2,
                "checkpoint_dir": os.path.abspath(a.ckpt_dir), "argv": sys.argv, "cwd": os.getcwd(),
                "resume": ["--resume_from_checkpoint", "{checkpoint}"]})
        for k in range(1, a.saves + 1):
            time.sleep(max(0.0, t0 + k * a.every - time.time()))
            step = k * a.steps_per_save
            record({"step": step, "t": round(time.time() - t0, 3), "loss": 0.5, "lr": 1e-3, "grad_norm": 1.0,
                    "sps": 100.0})
            folder = os.path.join(a.ckpt_dir, f"checkpoint-{step}")
            try:
                os.makedirs(folder)
                save_file(weights, os.path.join(folder, "model.safetensors"))
                with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                    json.dump({"global_step": step, "max_steps": total}, f)
            except Exception:
                traceback.print_exc()
                sys.stdout.flush()
                sys.exit(1)
            print(f"saved {folder}", flush=True)
            names = sorted((n for n in os.listdir(a.ckpt_dir) if n.startswith("checkpoint-")),
                           key=lambda n: int(n.split("-")[1]))
            for old in names[:-a.keep] if a.keep else []:
                shutil.rmtree(os.path.join(a.ckpt_dir, old))
    tmp = os.path.join(a.run_dir, ".final.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": total}, f)
    os.replace(tmp, os.path.join(a.run_dir, "final_val_metrics.json"))


if __name__ == "__main__":
    main()

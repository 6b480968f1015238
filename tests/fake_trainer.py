"""A real process that writes the telemetry contract on a schedule, with faults on demand.

    python tests/fake_trainer.py RUN_DIR --records 30 --dt 0.05 [--nan-at 120] [--hang-at 100] ...

Steps advance by --every per record; an eval record follows every --eval-every steps. Used by
the watchdog scenario tests and benchmarks (the real templates are tested on their own).
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervise.contract import atomic_write_json, dumps  # noqa: E402
from supervise.vocabulary import METRICS, SENTINEL  # noqa: E402


class MetricsWriter:
    """Appends records, one ``os.write`` per line on an O_APPEND descriptor: a reader sees
    whole lines or a torn tail, never two writers' bytes interleaved in one line."""

    def __init__(self, path: str | os.PathLike):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.t0 = time.monotonic()
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, rec: dict) -> None:
        rec.setdefault("t", round(time.monotonic() - self.t0, 3))
        os.write(self.fd, dumps(rec).encode())

    def start(self, **fields) -> None:
        self.write({"event": "start", "t": 0, "pid": os.getpid(), **fields})

    def step(self, step: int, loss, lr, grad_norm, sps, **extra) -> None:
        self.write({"step": step, "t": round(time.monotonic() - self.t0, 3), "loss": loss,
                    "lr": lr, "grad_norm": grad_norm, "sps": sps, **extra})

    def eval(self, step: int, eval_auroc, eval_acc, **extra) -> None:
        self.write({"step": step, "eval_auroc": eval_auroc, "eval_acc": eval_acc, **extra})

    def fatal(self, step: int, reason: str) -> None:
        self.write({"step": step, "t": round(time.monotonic() - self.t0, 3), "FATAL": reason})

    def close(self) -> None:
        os.close(self.fd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--records", type=int, default=30)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--dt", type=float, default=0.05)
    p.add_argument("--silent-start", type=float, default=0.0)
    p.add_argument("--no-start", action="store_true")
    p.add_argument("--num-labels", type=int, default=2)
    p.add_argument("--loss", type=float, default=None, help="constant loss instead of a falling one")
    p.add_argument("--grad", type=float, default=1.0)
    p.add_argument("--grad-from", type=int, default=None)
    p.add_argument("--grad-value", type=float, default=None)
    p.add_argument("--grad-spike-at", type=int, default=None)
    p.add_argument("--sps", type=float, default=100.0)
    p.add_argument("--sps-from", type=int, default=None)
    p.add_argument("--sps-value", type=float, default=None)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--auroc", type=float, default=None, help="constant AUROC instead of a rising one")
    p.add_argument("--nan-at", type=int, default=None)
    p.add_argument("--null-grad-at", type=int, default=None)
    p.add_argument("--fatal-at", type=int, default=None)
    p.add_argument("--fatal-reason", default="labels out of range: found 3 classes, expected 2")
    p.add_argument("--hang-at", type=int, default=None)
    p.add_argument("--exit-at", type=int, default=None)
    p.add_argument("--oom-at", type=int, default=None)
    p.add_argument("--crash-at", type=int, default=None)
    p.add_argument("--loss-from", type=int, default=None, help="from this step the loss is --loss-value")
    p.add_argument("--loss-until", type=int, default=None, help="... up to this step (a spike)")
    p.add_argument("--loss-value", type=float, default=None)
    p.add_argument("--virtual-dt", type=float, default=None, help="record time t advances this much per record")
    p.add_argument("--run-id", default=None, help="start record and sentinel carry this run_id")
    p.add_argument("--task", default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--expect-at", type=int, default=None, help="announce a pause of --pause seconds at this step")
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--eval-pause", type=float, default=0.0, help="each eval takes this long, unannounced")
    p.add_argument("--garbage", action="store_true", help="write stray and torn lines between records")
    p.add_argument("--no-sentinel", action="store_true")
    p.add_argument("--host", default=None, help="the start record names this host (another machine's trainer)")
    p.add_argument("--linger", type=float, default=0.0, help="seconds to live on after the sentinel")
    a = p.parse_args()

    run = Path(a.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    time.sleep(a.silent_start)
    w = MetricsWriter(run / METRICS)
    total = a.records * a.every
    if not a.no_start:
        extra = {k: v for k, v in (("run_id", a.run_id), ("task", a.task), ("vocab_size", a.vocab_size),
                                   ("host", a.host)) if v}
        w.start(total_steps=total, num_labels=a.num_labels, world_size=1, batch_size=8, time=time.time(), **extra)
    chance = math.log(a.num_labels)
    for i in range(1, a.records + 1):
        step = i * a.every
        if a.hang_at is not None and step >= a.hang_at:
            print(f"step {step}: hanging", flush=True)
            time.sleep(3600)
        if a.exit_at is not None and step >= a.exit_at:
            os._exit(0)
        if a.oom_at is not None and step >= a.oom_at:
            print("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
                  "    loss.backward()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                  "2.00 GiB. GPU 0 has a total capacity of 79.10 GiB", file=sys.stderr, flush=True)
            sys.exit(1)
        if a.crash_at is not None and step >= a.crash_at:
            raise ValueError(f"bad batch at step {step}: expected 2 labels, found 3")
        if a.fatal_at is not None and step >= a.fatal_at:
            w.fatal(step, a.fatal_reason)
            raise SystemExit(f"ValueError: {a.fatal_reason} at step {step}")
        loss = a.loss if a.loss is not None else chance * (0.25 + 0.75 * max(0.0, 1 - i / 30))
        if a.loss_from is not None and a.loss_from <= step <= (a.loss_until or step):
            loss = a.loss_value
        if a.nan_at is not None and step >= a.nan_at:
            loss = float("nan")
        if a.expect_at == step:
            w.write({"event": "expect", "seconds": a.pause, "why": "eval"})
            time.sleep(a.pause)
        grad = a.grad
        if a.grad_from is not None and step >= a.grad_from:
            grad = a.grad_value
        if a.grad_spike_at == step:
            grad = 1e4
        if a.null_grad_at == step:
            grad = None
        sps = a.sps if a.sps_from is None or step < a.sps_from else a.sps_value
        t = {"t": round(i * a.virtual_dt, 3)} if a.virtual_dt else {}
        w.step(step, loss, 1e-4, grad, sps, **t)
        if a.garbage and i % 3 == 0:
            os.write(w.fd, b"Epoch 1:  40%|####      | 40/100 [00:04<00:06, 9.8it/s]\n")
            os.write(w.fd, b'{"step": %d, "loss"' % step)  # torn: completed by the next write
            time.sleep(a.dt / 2)
            os.write(w.fd, b': %r, "t": 1, "lr": 0.0001, "grad_norm": %r, "sps": %r}\n' % (loss, grad, sps))
        if a.eval_every and step % a.eval_every == 0:
            time.sleep(a.eval_pause)
            auroc = a.auroc if a.auroc is not None else min(0.97, 0.6 + 0.4 * i / 30)
            w.eval(step, auroc, 0.5 + auroc / 3, eval_loss=loss)
        print(f"step {step} loss {loss}", flush=True)
        time.sleep(a.dt)
    if not a.no_sentinel:
        final = {"eval_auroc": 0.97, "eval_acc": 0.91, "step": total}
        atomic_write_json(run / SENTINEL, {**final, "run_id": a.run_id} if a.run_id else final)
    time.sleep(a.linger)


if __name__ == "__main__":
    main()

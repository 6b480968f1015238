"""A plain training loop at a slow step rhythm, healthy or hung for real (benchmarks/stall_limit.py
--real, tests/test_hang_frames.py).

    python benchmarks/rhythm_loop.py RUN_DIR --every 10 --hang step     # hangs in fetch_batch after --steps steps
    python benchmarks/rhythm_loop.py RUN_DIR --every 10 --hang eval     # hangs halfway through an unannounced eval
    python benchmarks/rhythm_loop.py RUN_DIR --every 10 --healthy       # eval, save, long forward pass; then done

The run writes its first --history step records at once, their record times --every s apart
with an unannounced eval of --eval-x x --every after every --eval-every steps (a run already
under way: the watchdog's clock learns the rhythm from the records' times, as it would have
over the hours before), then goes on in real time: each step works (a forward pass in Python:
the frames move) and waits for its batch (a sleep), one step record per step. A hang blocks in a
queue nobody fills (a shard that never comes, a peer that never answers) and writes the wall
clock it began at into RUN_DIR/hang_at. --healthy runs through an unannounced eval of
--eval-x x --every, an unannounced checkpoint save (torch.save into a slow file) and a forward
pass of --eval-x x --every, then writes the sentinel. Uses supervise.telemetry.Telemetry (the
in-process stack handler) unless --bare.
"""
import argparse
import json
import os
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fetch_batch(hang: bool):
    if hang:
        queue.Queue().get()   # the hang between steps: nobody ever puts
    return 1


def next_eval_batch(i: int, hang: bool):
    if hang:
        queue.Queue().get()   # the hang inside an eval
    return i


def attention(x: float, k: int) -> float:
    for j in range(3000):
        x = (x * 1.000001 + k + j) % 1e6
    return x


def mlp(x: float, k: int) -> float:
    for j in range(2000):
        x = (x * 0.999999 + k - j) % 1e6
    return x


def norm(x: float, k: int) -> float:
    for j in range(1000):
        x = abs(x - j) % 1e6
    return x


def block(x: float, k: int) -> float:
    return norm(mlp(attention(x, k), k), k)


def forward(seconds: float) -> float:
    """Python work for ``seconds``: a model's blocks (attention, mlp, norm) one after another,
    as a forward pass in Python goes: the frames move."""
    end, x, k = time.monotonic() + seconds, 0.0, 0
    while time.monotonic() < end:
        x = block(x, k)
        k += 1
    return x


def evaluate(seconds: float, hang: bool, mark) -> None:
    start, i = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        late = hang and time.monotonic() - start >= seconds / 2
        if late:
            mark()
        next_eval_batch(i, late)
        forward(0.05)
        i += 1


class SlowFile:
    """A checkpoint file on a slow volume: every write waits until ``seconds`` have passed."""

    def __init__(self, seconds: float):
        self.until, self.n = time.monotonic() + seconds, 0

    def write(self, b):
        left = self.until - time.monotonic()
        if left > 0:
            time.sleep(left)
        self.n += len(b)
        return len(b)

    def flush(self):
        pass


def save_checkpoint(seconds: float, step: int) -> None:
    import torch
    torch.save({"step": step, "w": torch.zeros(4)}, SlowFile(seconds))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--every", type=float, default=10.0, help="s per step")
    p.add_argument("--eval-every", type=int, default=6, help="steps between evals")
    p.add_argument("--eval-x", type=float, default=3.0, help="an eval lasts this many steps' time")
    p.add_argument("--history", type=int, default=24, help="step records written at once, --every apart in record time")
    p.add_argument("--steps", type=int, default=3, help="real steps before the hang (or between the healthy pauses)")
    p.add_argument("--hang", choices=("none", "step", "eval"), default="none")
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--only", choices=("eval", "save", "forward"), help="--healthy with this one pause, --pause s long")
    p.add_argument("--pause", type=float, default=0.0, help="s of the --only pause")
    p.add_argument("--work", type=float, default=0.5, help="share of a step spent in the forward pass")
    p.add_argument("--bare", action="store_true", help="no Telemetry: records by hand (py-spy takes the stacks)")
    a = p.parse_args()
    os.makedirs(a.run_dir, exist_ok=True)
    run = Path(a.run_dir)
    L = a.every
    span = (a.history + (a.history // a.eval_every) * a.eval_x) * L + L
    if a.bare:
        fd = os.open(run / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        t0 = time.time() - span

        def write(rec):
            os.write(fd, (json.dumps(rec) + "\n").encode())
        write({"event": "start", "t": 0, "pid": os.getpid()})
        tm = None
    else:
        from supervise.telemetry import Telemetry
        tm = Telemetry(a.run_dir, total_steps=100000, batch_size=8)
        tm.__enter__()
        tm.t0 = time.time() - span   # record time goes on from the history below
        t0 = tm.t0
        write = tm._write
    t, step = 0.0, 0
    for i in range(1, a.history + 1):   # the run so far, in record time
        t, step = t + L, step + 10
        write({"step": step, "t": round(t, 3), "loss": 0.5, "lr": 0.1, "grad_norm": 1.0})
        if i % a.eval_every == 0:
            t += a.eval_x * L
            write({"step": step, "t": round(t, 3), "eval_loss": 0.4})

    def now_t():
        return round(time.time() - t0, 3)

    def mark():
        if not (run / "hang_at").exists():
            (run / "hang_at").write_text(f"{time.time():.3f}\n")

    def one_step():
        nonlocal step
        forward(a.work * L)
        time.sleep((1 - a.work) * L)
        step += 10
        write({"step": step, "t": now_t(), "loss": 0.5, "lr": 0.1, "grad_norm": 1.0})

    print(f"pid {os.getpid()} every {L:g}s hang {a.hang}", flush=True)
    for _ in range(a.steps):
        one_step()
    if a.hang == "step":
        mark()
        fetch_batch(True)
    if a.hang == "eval":
        evaluate(a.eval_x * L, True, mark)
    if a.healthy or a.only:
        if a.only in (None, "eval"):
            evaluate(a.pause or a.eval_x * L, False, mark)       # an unannounced eval of 3 steps
            write({"step": step, "t": now_t(), "eval_loss": 0.4})
            for _ in range(a.steps):
                one_step()
        if a.only in (None, "save"):
            save_checkpoint(a.pause or max(2 * L, 25.0), step)   # an unannounced save, frames still > --hang-window
            for _ in range(a.steps):
                one_step()
        if a.only in (None, "forward"):
            forward(a.pause or a.eval_x * L)                    # a long forward pass: silent, frames moving
            one_step()
            for _ in range(a.steps):
                one_step()
        if tm is not None:
            tm.last_step = step
            tm.done(eval_loss=0.4)
        else:
            with open(run / "final_val_metrics.json", "w") as f:
                json.dump({"step": step, "eval_loss": 0.4}, f)
    if tm is not None:
        tm.__exit__(None, None, None)


if __name__ == "__main__":
    main()

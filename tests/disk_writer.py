"""A trainer stand-in that fills a volume with files the project cannot parse. It writes the
telemetry contract to RUN_DIR/metrics.jsonl (a start record with total_steps, a step record per
tick) and, by --fill:

- ``pt``: every --every s a ``step_N.pt`` of --mb MB of random bytes in --dir (not a zip: the
  checkpoint probe cannot read it; the start record names --dir as its checkpoint_dir); with
  --keep K the oldest beyond K are deleted after each save (a rotating writer);
- ``stdout``: --mb MB of log lines per --every s printed to its stdout (RUN_DIR/train.log);
- ``log``: the same appended to the file --log (a log of its own).

Any error (a full volume) prints its traceback and exits 1, as a trainer does: on a full volume
that traceback may not reach train.log either.

    python tests/disk_writer.py RUN_DIR --fill pt --dir DIR [--every 2] [--mb 4] [--keep 0] [--ticks 30]
"""
import argparse
import json
import os
import sys
import time
import traceback


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--fill", choices=("pt", "stdout", "log"), required=True)
    p.add_argument("--dir", default=None)
    p.add_argument("--log", default=None)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--mb", type=float, default=4.0)
    p.add_argument("--keep", type=int, default=0)
    p.add_argument("--ticks", type=int, default=30)
    a = p.parse_args()
    os.makedirs(a.run_dir, exist_ok=True)
    start = {"event": "start", "t": 0, "pid": os.getpid(), "total_steps": a.ticks * 10, "num_labels": 2,
             "argv": sys.argv, "cwd": os.getcwd()}
    if a.fill == "pt":
        os.makedirs(a.dir, exist_ok=True)
        start["checkpoint_dir"] = os.path.abspath(a.dir)
    if a.fill == "log":
        os.makedirs(os.path.dirname(os.path.abspath(a.log)), exist_ok=True)
    line = "x" * 99 + "\n"
    chunk = line * max(1, int(a.mb * 1e6 / len(line)))
    t0 = time.time()
    try:
        with open(os.path.join(a.run_dir, "metrics.jsonl"), "a") as m, \
                open(a.log if a.fill == "log" else os.devnull, "a") as log:
            def record(rec):
                m.write(json.dumps(rec) + "\n")
                m.flush()

            record(start)
            for k in range(1, a.ticks + 1):
                time.sleep(max(0.0, t0 + k * a.every - time.time()))
                step = k * 10
                record({"step": step, "t": round(time.time() - t0, 3), "loss": 0.5, "lr": 1e-3, "grad_norm": 1.0,
                        "sps": 100.0})
                if a.fill == "pt":
                    with open(os.path.join(a.dir, f"step_{step}.pt"), "wb") as f:
                        f.write(os.urandom(int(a.mb * 1e6)))
                    names = sorted((n for n in os.listdir(a.dir) if n.startswith("step_")),
                                   key=lambda n: int(n[5:-3]))
                    for old in names[:-a.keep] if a.keep else []:
                        os.unlink(os.path.join(a.dir, old))
                    print(f"saved step_{step}.pt", flush=True)
                elif a.fill == "stdout":
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                else:
                    log.write(chunk)
                    log.flush()
    except Exception:
        try:
            traceback.print_exc()
            sys.stdout.flush()
        except Exception:
            pass
        os._exit(1)
    tmp = os.path.join(a.run_dir, ".final.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": a.ticks * 10}, f)
    os.replace(tmp, os.path.join(a.run_dir, "final_val_metrics.json"))


if __name__ == "__main__":
    main()

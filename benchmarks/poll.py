"""What one watchdog poll costs on a huge metrics file (issue 35's, built exactly: 2,000,000
lines, 166 MB, an eval every 25,000 lines, no start record), next to re-reading the whole file
(what a naive watchdog does), how many polls pass from a fault to the watchdog's exit, and what
the checkpoint probe adds to a poll (50 unchanged checkpoints: HF folders, Lightning files).

    python benchmarks/poll.py [--lines 2000000] [--poll 0.5]
    python benchmarks/poll.py --only cpu [--rate 2000] [--cpu-poll 1] [--seconds 60] [--repeat 3]
                                         [--prefill 2000000] [--before DIR]

Both sides run in this one process on the same file, so the ratio holds on a noisy machine.

The watchdog's own cost (``--only cpu``, also part of a full run): a writer appends --rate
records a second (a busy LM run logging every step on 8 ranks) while ``scripts/watchdog.py
--poll --cpu-poll`` follows it; its CPU time over --seconds (after a 5 s warm-up) is reported as
% of one core, and its RSS sampled every 5 s; --repeat N measures N times one after the other
and reports the median (a busy machine). The run folder starts with issue 35's files (its
metrics.jsonl, --prefill lines, and its 110 MB progress-bar train.log; --prefill 0: empty), which
the watchdog's first poll skims during the warm-up; the writer's start record then begins the
attempt that is measured. ``--before DIR`` runs the same beside a watchdog
from another checkout (the tree before a change), at the same time on the same machine, each
with its own run folder and writer: the figures side by side.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from supervise.observe.checkpoints import CheckpointWatch  # noqa: E402
from supervise.thresholds import Thresholds  # noqa: E402
from supervise.tools.watch import Watchdog  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from checkin import issue_log, issue_metrics  # noqa: E402  issue 35's files, exactly

STEP = '{"step":%d,"t":%d.5,"loss":0.31,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n'


def naive_poll(path: Path) -> int:
    n = 0
    with open(path) as f:
        for line in f:
            json.loads(line)
            n += 1
    return n


def poll_cost(lines: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        issue_metrics(run / "metrics.jsonl", lines)
        hf_checkpoints(run / "checkpoints", 50)   # the disk probe on: RUN_DIR/checkpoints is followed
        size = (run / "metrics.jsonl").stat().st_size
        t0 = time.perf_counter()
        full = Watchdog(run, Thresholds(poll=30, max_stall=1e9, hard_timeout=1e9))
        full.observer.reader.catchup = 1 << 62   # what v0.1 did: fold every line once
        full.poll()
        full_catch_up = time.perf_counter() - t0
        (run / ".scan.json").unlink(missing_ok=True)   # a re-attach, not a resume of the scan just kept
        w = Watchdog(run, Thresholds(poll=30, max_stall=1e9, hard_timeout=1e9))
        t0 = time.perf_counter()
        w.poll()
        catch_up = time.perf_counter() - t0
        reader = w.observer.reader
        skipped = reader.skipped_bytes
        step = lines * 100   # the issue's file ends at step lines x 10: these come after it
        costs, read = [], []
        with open(run / "metrics.jsonl", "a") as f:
            for _ in range(200):
                step += 10
                f.write(STEP % (step, step))
                f.flush()
                before = reader.bytes_read
                t0 = time.perf_counter()
                v = w.poll()  # observe, judge, save watchdog.json: one poll of the watchdog
                costs.append(time.perf_counter() - t0)
                read.append(reader.bytes_read - before)
                assert v.state == "watching", v.line
        assert len(w.observer.last.disk.checkpoints) == 50
        naive = []
        for _ in range(2):
            t0 = time.perf_counter()
            naive_poll(run / "metrics.jsonl")
            naive.append(time.perf_counter() - t0)
    poll = statistics.median(costs)
    return {"lines": lines, "file_mb": size / 1e6, "catch_up_s": catch_up, "full_catch_up_s": full_catch_up,
            "skipped_mb": skipped / 1e6, "poll_s": poll,
            "poll_p95_s": sorted(costs)[int(len(costs) * 0.95)], "bytes_per_poll": statistics.median(read),
            "naive_s": min(naive), "ratio": min(naive) / poll}


def _safetensors(path: Path, n: int) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4 * n))


def hf_checkpoints(folder: Path, n: int) -> None:
    for i in range(1, n + 1):
        c = folder / f"checkpoint-{i * 100}"
        c.mkdir(parents=True)
        _safetensors(c / "model.safetensors", 1000)
        (c / "trainer_state.json").write_text(json.dumps({"global_step": i * 100}))


def checkpoint_poll_cost(n: int = 50, polls: int = 2000) -> dict:
    """Median seconds of CheckpointWatch.poll on a folder of ``n`` unchanged checkpoints, after a
    first poll that reads them all: HF checkpoint-N folders, and Lightning .ckpt files (each
    re-stat'ed: a save may overwrite one in place)."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        hf, pl = Path(d) / "hf", Path(d) / "pl"
        pl.mkdir()
        hf_checkpoints(hf, n)
        for i in range(1, n + 1):
            with zipfile.ZipFile(pl / f"epoch=0-step={i * 100}.ckpt", "w") as z:
                z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
                z.writestr("archive/data/0", bytes(4000))
        for name, folder in (("hf", hf), ("lightning", pl)):
            w = CheckpointWatch([folder])
            t0 = time.perf_counter()
            first = w.poll(time.time())
            out[f"{name}_first_s"] = time.perf_counter() - t0
            assert len(first.checkpoints) == n and all(c.complete for c in first.checkpoints)
            costs = []
            for _ in range(polls):
                t0 = time.perf_counter()
                w.poll(time.time())
                costs.append(time.perf_counter() - t0)
            out[f"{name}_s"] = statistics.median(costs)
            out[f"{name}_p95_s"] = sorted(costs)[int(len(costs) * 0.95)]
    return out


def latency(kind: str, poll: float) -> float:
    """Polls from the fault to the watchdog's exit (stall: counted after max-stall runs out)."""
    fake = ROOT / "tests" / "fake_trainer.py"
    max_stall = 2.0
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "SUPERVISE_STATE_DIR": d + "/state"}
        args = {"dead": [], "nan": ["--nan-at", "2000"], "stall": ["--hang-at", "2000"]}[kind]
        log = open(Path(d) / "train.log", "wb")
        tr = subprocess.Popen([sys.executable, str(fake), d, "--records", "100000", "--dt", "0.02",
                               "--no-sentinel", *args], stdout=log, stderr=log, env=env)
        metrics = Path(d) / "metrics.jsonl"
        while not metrics.exists() or metrics.read_bytes().count(b"\n") < 5:
            time.sleep(0.01)
        wd = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "watchdog.py"), d, "--poll", str(poll),
                               "--max-stall", str(max_stall)], stdout=subprocess.PIPE, text=True, env=env)
        time.sleep(3 * poll)
        if kind == "dead":
            fault = time.time()
            tr.send_signal(signal.SIGKILL)
        else:
            needle = b'"step":2000,' if kind == "nan" else b'"step":1990,'  # the hang comes before 2000
            while needle not in metrics.read_bytes():
                time.sleep(0.005)
            fault = time.time() if kind == "nan" else metrics.stat().st_mtime + max_stall
        out, _ = wd.communicate(timeout=60)
        took = time.time() - fault
        tr.kill()
        tr.wait()
        log.close()
        assert f"ANOMALY {kind}" in out, out
    return took / poll


WRITER = r"""
import json, os, sys, time
run, rate = sys.argv[1], float(sys.argv[2])
fd = os.open(os.path.join(run, "metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, (json.dumps({"event": "start", "t": 0, "pid": os.getpid(), "time": time.time(), "run_id": "cpu",
                          "task": "lm", "vocab_size": 50257, "total_steps": 10 ** 9, "world_size": 8}) + "\n").encode())
t0 = time.monotonic()
step = 0
while True:
    now = time.monotonic() - t0
    due = int(now * rate) - step
    if due > 0:
        lines = []
        for _ in range(due):
            step += 1
            loss = 3.0 + 2.0 / (1 + step / 5000) + 0.01 * ((step * 7919) % 13)
            lines.append('{"step":%d,"t":%.3f,"loss":%.5f,"lr":0.0003,"grad_norm":%.4f,"sps":%.1f,"rank":%d}\n'
                         % (step, now, loss, 0.8 + 0.01 * (step % 17), 950.0 + step % 11, step % 8))
            if step % 2000 == 0:
                lines.append('{"step":%d,"t":%.3f,"eval_loss":%.4f}\n' % (step, now, loss + 0.1))
        os.write(fd, "".join(lines).encode())
    time.sleep(0.01)
"""


def cpu_cost(trees: list, rate: float, poll: float, seconds: float, prefill: int = 0) -> list:
    """For each checkout in ``trees`` at once: a writer at ``rate`` records/s into its own run
    folder and that checkout's scripts/watchdog.py --poll ``poll`` beside it; the watchdog's CPU
    % of one core over ``seconds`` (after 5 s), RSS samples every 5 s, and the file's size."""
    import psutil
    out = []
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "SUPERVISE_STATE_DIR": d + "/state"}
        runs = []
        for i, tree in enumerate(trees):
            run = Path(d) / f"run{i}"
            run.mkdir()
            if prefill:
                issue_metrics(run / "metrics.jsonl", prefill)
                issue_log(run / "train.log")
            log = open(run / "train.log", "ab")
            writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run), str(rate)], stdout=log, stderr=log)
            while not (run / "metrics.jsonl").exists():
                time.sleep(0.01)
            wd = subprocess.Popen([sys.executable, str(Path(tree) / "scripts" / "watchdog.py"), str(run), "--poll",
                                   str(poll), "--max-stall", "1h", "--hard-timeout", "100h"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            runs.append((tree, run, log, writer, wd))
        try:
            time.sleep(5)
            procs = [psutil.Process(r[4].pid) for r in runs]
            t0 = time.monotonic()
            cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
            rss = [[p.memory_info().rss] for p in procs]
            while time.monotonic() - t0 < seconds:
                time.sleep(min(5.0, seconds - (time.monotonic() - t0)) if seconds > time.monotonic() - t0 else 0)
                for p, r in zip(procs, rss):
                    r.append(p.memory_info().rss)
            wall = time.monotonic() - t0
            for (tree, run, *_), p, c0, r in zip(runs, procs, cpu0, rss):
                assert p.is_running(), f"the watchdog of {tree} ended early"
                out.append({"tree": tree, "cpu_pct": 100 * (sum(p.cpu_times()[:2]) - c0) / wall, "wall_s": wall,
                            "rss_mb": [x / 2 ** 20 for x in r], "records": sum(1 for _ in open(run / "metrics.jsonl", "rb")),
                            "file_mb": (run / "metrics.jsonl").stat().st_size / 1e6})
        finally:
            for _, _, log, writer, wd in runs:
                for proc in (wd, writer):
                    proc.terminate()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                log.close()
    return out


def print_cpu(a) -> None:
    trees = ([a.before] if a.before else []) + [str(ROOT)]
    rounds = []
    for i in range(a.repeat):
        got = cpu_cost(trees, a.rate, a.cpu_poll, a.seconds, a.prefill)
        rounds.append(got)
        if a.repeat > 1:
            print(f"  round {i + 1}: " + ", ".join(f"{'before' if a.before and r['tree'] == a.before else 'this tree'} "
                                                   f"{r['cpu_pct']:.2f}%" for r in got), flush=True)
    load = os.getloadavg()
    for k, tree in enumerate(trees):
        who = "before" if a.before and tree == a.before else "this tree"
        pcts = [rnd[k]["cpu_pct"] for rnd in rounds]
        r = rounds[-1][k]
        rss = r["rss_mb"]
        print(f"watchdog's own cost ({who}: {tree}): median {statistics.median(pcts):.2f}% of one core "
              f"(min {min(pcts):.2f}, max {max(pcts):.2f}, {len(pcts)} runs of {r['wall_s']:.0f} s) at {a.rate:g} "
              f"records/s, --poll {a.cpu_poll:g} (target <= 3%); RSS {rss[0]:.1f} -> {rss[-1]:.1f} MB "
              f"(max {max(rss):.1f}); file {r['records']:,} lines, {r['file_mb']:.0f} MB")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--only", choices=["cpu"], help="run only the watchdog's own cost")
    p.add_argument("--rate", type=float, default=2000.0, help="records/s the writer appends (cpu)")
    p.add_argument("--cpu-poll", type=float, default=1.0, help="the watchdog's --poll (cpu)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long the CPU is measured (cpu)")
    p.add_argument("--before", metavar="DIR", help="another checkout's watchdog, measured at the same time (cpu)")
    p.add_argument("--repeat", type=int, default=3, help="CPU measurements one after the other; the median (cpu)")
    p.add_argument("--prefill", type=int, default=2_000_000,
                   help="lines of issue 35's metrics.jsonl (and its train.log) the run folder starts with (cpu)")
    a = p.parse_args()
    if a.only == "cpu":
        print_cpu(a)
        return
    r = poll_cost(a.lines)
    print(f"metrics file: {r['lines']:,} lines, {r['file_mb']:.0f} MB")
    print(f"first poll, re-attach (head + notable lines + tail, {r['skipped_mb']:.0f} MB skimmed): "
          f"{r['catch_up_s']:.2f} s (target <= 1 s)")
    print(f"first poll, folding every line (v0.1): {r['full_catch_up_s']:.2f} s "
          f"-> re-attach {r['full_catch_up_s'] / r['catch_up_s']:.0f}x faster")
    print(f"steady poll (the disk probe on, 50 checkpoints): median {r['poll_s'] * 1e3:.3f} ms, "
          f"p95 {r['poll_p95_s'] * 1e3:.3f} ms, {r['bytes_per_poll']:.0f} bytes read (target <= 1 ms)")
    print(f"re-reading the whole file: {r['naive_s']:.2f} s")
    print(f"ratio: {r['ratio']:,.0f}x cheaper per poll (target >= 1000x)")
    c = checkpoint_poll_cost()
    for name, what in (("hf", "50 HF checkpoint-N folders"), ("lightning", "50 Lightning .ckpt files")):
        print(f"checkpoint probe, steady poll over {what}: median {c[name + '_s'] * 1e6:.0f} us, "
              f"p95 {c[name + '_p95_s'] * 1e6:.0f} us (first poll {c[name + '_first_s'] * 1e3:.1f} ms)")
    for kind in ("dead", "nan", "stall"):
        n = latency(kind, a.poll)
        extra = " after max-stall" if kind == "stall" else ""
        print(f"latency {kind}: {n:.2f} polls{extra} from fault to exit (poll {a.poll}s)")
    print_cpu(a)


if __name__ == "__main__":
    main()

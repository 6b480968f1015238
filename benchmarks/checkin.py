"""What one check-in costs on a 2,000,000-line metrics file beside a 100 MB log, cold (no scan
kept: the whole file skimmed for notable records) and warm (the scan kept in RUN_DIR/.scan.json
by the look before: only what was appended since is read), in this process and as a command,
next to the by-hand reads it replaces (tail -n 50 of both files, and an nvidia-smi-style query).

    python benchmarks/checkin.py [--lines 2000000] [--log-mb 100] [--nan] [--python PY] [--before DIR]

--nan puts a NaN loss in the middle of the file (each look must name it). --python runs the
command with another interpreter (one with only psutil installed: the hot path's promise).
--before DIR runs DIR's scripts/checkin.py beside this tree's, on the same files in the same
run (another checkout: the tree before a change; it ignores the scan file). The command is timed
as this environment runs Python (PYTHONDONTWRITEBYTECODE as set: without .pyc files every module
is compiled from source at each start) and with .pyc files (a pip install's, or any checkout
whose __pycache__ can be written), each the min and median of --runs, wall and CPU (user + sys).
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from poll import STEP, make_file  # noqa: E402

SCAN = ".scan.json"
NAN = '{"step":%d,"t":%d.5,"loss":NaN,"lr":0.0001,"grad_norm":1.1,"sps":812.0}\n'


def rchar() -> int:
    """Bytes this process has read through read(2) so far (Linux /proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("rchar")).split()[1])


def nan_in_the_middle(path: Path, lines: int) -> int:
    """Rewrite the middle line as a NaN loss of the same length; its step."""
    step = lines // 2
    old = (STEP % (step * 10, step)).encode()
    new = (NAN % (step * 10, step)).encode()
    new = new[:-1] + b" " * (len(old) - len(new)) + b"\n"
    data = path.read_bytes()
    i = data.index(old)
    with open(path, "r+b") as f:
        f.seek(i)
        f.write(new)
    return step * 10


class Appender:
    """Appends step records after the file's last one (a warm look finds something new)."""

    def __init__(self, path: Path, lines: int):
        self.path, self.step = path, lines

    def __call__(self, n: int = 500):
        with open(self.path, "a") as f:
            f.write("".join(STEP % (i * 10, i) for i in range(self.step, self.step + n)))
        self.step += n


def timed(cmd: list, env: dict, runs: int, before=None) -> dict:
    """min/median wall and CPU of ``runs`` runs of ``cmd`` (``before()`` ahead of each), and the
    last one's output."""
    walls, cpus = [], []
    out = ""
    for _ in range(runs):
        if before:
            before()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        out = p.stdout + p.stderr
    return {"wall": (min(walls), statistics.median(walls)), "cpu": (min(cpus), statistics.median(cpus)), "out": out}


def show(f: dict) -> str:
    return (f"wall min {f['wall'][0]:.3f} s, median {f['wall'][1]:.3f} s; "
            f"CPU min {f['cpu'][0]:.3f} s, median {f['cpu'][1]:.3f} s")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--log-mb", type=int, default=100)
    p.add_argument("--nan", action="store_true", help="a NaN loss in the middle of the file")
    p.add_argument("--python", default=sys.executable, help="the interpreter the command runs with")
    p.add_argument("--before", metavar="DIR", help="another checkout's checkin.py, measured beside this one")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        run.mkdir()
        make_file(run / "metrics.jsonl", a.lines)
        nan_step = nan_in_the_middle(run / "metrics.jsonl", a.lines) if a.nan else None
        line = b"Epoch 1:  40%|####      | 40/100 [00:04<00:06, 9.8it/s]\r" * 3 + b"step 10 loss 0.3\n"
        with open(run / "train.log", "wb") as f:
            chunk = line * ((1 << 20) // len(line) + 1)
            for _ in range(a.log_mb):
                f.write(chunk[:1 << 20])
        size = (run / "metrics.jsonl").stat().st_size
        append = Appender(run / "metrics.jsonl", a.lines)
        from supervise.tools import checkin
        from supervise.contract import atomic_write_json

        def drop_scan():
            (run / SCAN).unlink(missing_ok=True)

        def check(text: str):
            if nan_step is not None:
                assert "ANOMALY nan" in text and f"at step {nan_step}" in text, text[:300]

        checkin.summary(run)  # warm the imports, as a second check-in would find them

        def measure(before, named=True):
            times, reads = [], []
            for _ in range(a.runs):
                before()
                t0 = time.perf_counter()
                r0 = rchar()
                text = checkin.summary(run)
                reads.append(rchar() - r0)
                times.append(time.perf_counter() - t0)
                if named:
                    check(text)
            return statistics.median(times), statistics.median(reads), text

        cold, cold_read, _ = measure(drop_scan)
        checkin.summary(run)
        warm, warm_read, _ = measure(append)
        nan = f", a NaN at step {nan_step}" if nan_step is not None else ""
        print(f"files: {a.lines:,}-line metrics.jsonl ({size / 1e6:.0f} MB{nan}), {a.log_mb} MB train.log")
        print(f"check-in in process, cold (no scan kept: the whole file skimmed): median {cold * 1e3:.1f} ms, "
              f"{cold_read / 1024:.0f} KiB read (target < 0.3 s)")
        print(f"check-in in process, warm (the scan kept, 500 records appended since): median {warm * 1e3:.1f} ms, "
              f"{warm_read / 1024:.0f} KiB read (target < 0.1 s)")

        # as a command: as this environment runs Python, and with .pyc files
        pyc = Path(d) / "pyc"
        env_here = dict(os.environ)
        env_pyc = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env_pyc["PYTHONPYCACHEPREFIX"] = str(pyc)
        trees = ([("before", Path(a.before))] if a.before else []) + [("this tree", ROOT)]
        bytecode = "no .pyc: every module compiled at each start" if (
            os.environ.get("PYTHONDONTWRITEBYTECODE") and not (ROOT / "supervise" / "__pycache__").exists()) else \
            "with whatever .pyc exist"
        print(f"check-in as a command ({a.python}; python start included, {a.runs} runs each):")
        for name, tree in trees:
            cmd = [a.python, str(tree / "scripts" / "checkin.py"), str(run)]
            subprocess.run(cmd, capture_output=True, env=env_pyc)  # writes the .pyc files under pyc/
            for label, env in (("as this environment runs it, " + bytecode, env_here), ("with .pyc", env_pyc)):
                c = timed(cmd, env, a.runs, drop_scan)
                check(c["out"])
                subprocess.run(cmd, capture_output=True, env=env)
                w = timed(cmd, env, a.runs, append)
                check(w["out"])
                print(f"  {name}, {label}:")
                print(f"    cold: {show(c)} (target < 0.3 s)")
                print(f"    warm: {show(w)} (target < 0.1 s)")
        bare = timed([a.python, "-c", "pass"], env_here, a.runs)
        print(f"  for scale, {a.python} -c pass: {show(bare)}")

        # a live watchdog follows the run and kept no scan: head and tail only
        drop_scan()
        atomic_write_json(run / "watchdog.json", {"run_dir": str(run), "watchdog_pid": os.getpid(),
                                                  "state": "watching", "last_poll": time.time()})
        watched, read, text = measure(drop_scan, named=False)  # the watchdog saw the middle
        print(f"check-in in process, a live watchdog beside the run (no scan kept: head and tail only): median "
              f"{watched * 1e3:.1f} ms, {read / 1024:.0f} KiB read, {len(text)} chars out")
        t0 = time.perf_counter()
        subprocess.run(["tail", "-n", "50", str(run / "metrics.jsonl")], capture_output=True)
        subprocess.run(["tail", "-n", "50", str(run / "train.log")], capture_output=True)
        if shutil.which("nvidia-smi"):
            subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total",
                            "--format=csv"], capture_output=True)
        by_hand = time.perf_counter() - t0
        print(f"by hand: tail -n 50 of both files{' + nvidia-smi' if shutil.which('nvidia-smi') else ''}: "
              f"{by_hand:.3f} s, and their output is unparsed text")
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

"""What one check-in costs on issue 35's files: a 2,000,000-line metrics.jsonl (166 MB, an eval
every 25,000 lines, no start record) beside a 110 MB progress-bar train.log (1,700,000 tqdm
lines), built exactly as the issue gives them, cold (no scan kept, no watchdog.json) and warm
(the scan the look before kept), in this process and as a command (``cd T && PY
scripts/checkin.py proj/runs/big``), each round beside a bare ``PY -c pass``.

    python benchmarks/checkin.py [--lines 2000000] [--log-lines 1700000] [--runs 7] [--python PY]
                                 [--nan] [--before DIR]

--python runs the command with another interpreter (one with only psutil installed: the hot
path's promise). --nan puts a NaN loss in the middle of the file: the cold look must say that
it did not read there, and after one watchdog poll (which reads every notable line and keeps
its scan) a check-in must name it. --before DIR runs DIR's scripts/checkin.py beside this
tree's on the same files in the same rounds (another checkout: the tree before a change).

The command is timed as this environment runs Python (PYTHONDONTWRITEBYTECODE as set: without
.pyc files every module of the package is compiled from source at each start) and with .pyc
files (a pip install's, or any checkout whose __pycache__ can be written). Each round runs
bare, cold, warm (and the --before tree's) one after the other, so that a busy machine slows
them alike; the figures are the median and min of --runs rounds, wall and CPU (user + sys).
"""
import argparse
import json
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

SCAN = ".scan.json"
TQDM = "100%|##########| 500/500 [00:10<00:00, 48.1it/s] Loading weights\n"


def issue_metrics(path: Path, lines: int = 2_000_000, nan_at=None) -> None:
    """Issue 35's metrics.jsonl, exactly (``nan_at``: that step record's loss is NaN instead)."""
    line = json.dumps({"step": 0, "t": 0.0, "loss": 0.4, "lr": 2e-5, "grad_norm": 1.2, "sps": 250.0}) + "\n"
    with open(path, "w") as f:
        for s in range(1, lines + 1):
            rec = line.replace('"step": 0', f'"step": {s * 10}', 1)
            f.write(rec.replace('"loss": 0.4', '"loss": NaN') if s == nan_at else rec)
            if s % 25_000 == 0:
                f.write(json.dumps({"step": s * 10, "eval_auroc": 0.93, "eval_acc": 0.88}) + "\n")


def issue_log(path: Path, lines: int = 1_700_000) -> None:
    """Issue 35's train.log: one tqdm line, 1,700,000 times (110 MB)."""
    with open(path, "w") as f:
        block = TQDM * 10_000
        for _ in range(lines // 10_000):
            f.write(block)
        f.write(TQDM * (lines % 10_000))


def rchar() -> int:
    """Bytes this process has read through read(2) so far (Linux /proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("rchar")).split()[1])


class Appender:
    """Appends step records after the file's last one (a warm look finds something new)."""

    LINE = '{"step": %d, "t": 0.0, "loss": 0.4, "lr": 2e-05, "grad_norm": 1.2, "sps": 250.0}\n'

    def __init__(self, path: Path, lines: int):
        self.path, self.step = path, lines * 10

    def __call__(self, n: int = 500):
        with open(self.path, "a") as f:
            f.write("".join(self.LINE % (self.step + 10 * i) for i in range(1, n + 1)))
        self.step += 10 * n


def run_once(cmd: list, env: dict, cwd: Path) -> tuple:
    """(wall s, CPU s, output) of one run of ``cmd``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, p.stdout + p.stderr


def show(walls: list, cpus: list) -> str:
    return (f"median {statistics.median(walls):.3f} s (min {min(walls):.3f}), "
            f"CPU median {statistics.median(cpus):.3f} s")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--log-lines", type=int, default=1_700_000)
    p.add_argument("--nan", action="store_true", help="a NaN loss in the middle of the file")
    p.add_argument("--python", default=sys.executable, help="the interpreter the command runs with")
    p.add_argument("--before", metavar="DIR", help="another checkout's checkin.py, measured beside this one")
    p.add_argument("--runs", type=int, default=7)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        T = Path(d) / "T"
        run = T / "proj" / "runs" / "big"
        run.mkdir(parents=True)
        (T / "scripts").symlink_to(ROOT / "scripts")   # cd T && PY scripts/checkin.py proj/runs/big
        nan_step = a.lines // 2 if a.nan else None
        issue_metrics(run / "metrics.jsonl", a.lines, nan_step)
        issue_log(run / "train.log", a.log_lines)
        size = (run / "metrics.jsonl").stat().st_size
        log_size = (run / "train.log").stat().st_size
        append = Appender(run / "metrics.jsonl", a.lines)
        os.environ["SUPERVISE_STATE_DIR"] = str(Path(d) / "state")
        from supervise.observe.scan import WINDOW
        from supervise.tools import checkin

        def drop_scan():
            (run / SCAN).unlink(missing_ok=True)

        checkin.summary(run)  # warm the imports and the page cache, as a second check-in finds them

        def measure(before):
            times, reads = [], []
            for _ in range(a.runs):
                before()
                t0 = time.perf_counter()
                r0 = rchar()
                text = checkin.summary(run)
                reads.append(rchar() - r0)
                times.append(time.perf_counter() - t0)
            return statistics.median(times), statistics.median(reads), text

        cold, cold_read, cold_text = measure(drop_scan)
        checkin.summary(run)
        warm, warm_read, _ = measure(append)
        nan = f", a NaN at step {nan_step * 10}" if nan_step is not None else ""
        print(f"files (issue 35): {a.lines:,}-line metrics.jsonl ({size / 1e6:.0f} MB, an eval every 25,000 lines, "
              f"no start record{nan}), {a.log_lines:,}-line progress-bar train.log ({log_size / 1e6:.0f} MB)")
        print(f"check-in in process, cold (no scan, no watchdog: head + the last {WINDOW >> 20} MiB + tail): median "
              f"{cold * 1e3:.1f} ms, {cold_read / 2**20:.1f} MiB read (target < 0.3 s)")
        print(f"check-in in process, warm (the scan kept, 500 records appended since): median {warm * 1e3:.1f} ms, "
              f"{warm_read / 1024:.0f} KiB read (target < 0.1 s)")
        if nan_step is not None and size > WINDOW + (1 << 20):   # the NaN lies before the window
            assert "this look left" in cold_text and "ANOMALY nan" not in cold_text, cold_text[:400]
        elif nan_step is not None:
            assert "ANOMALY nan" in cold_text, cold_text[:400]

        # as a command, in rounds: bare, cold, warm (and the --before tree's cold and warm)
        pyc = Path(d) / "pyc"
        env_here = dict(os.environ)
        env_pyc = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env_pyc["PYTHONPYCACHEPREFIX"] = str(pyc)
        trees = [("this tree", ROOT)] + ([("before", Path(a.before))] if a.before else [])
        bytecode = "no .pyc: every module compiled at each start" if (
            os.environ.get("PYTHONDONTWRITEBYTECODE") and not (ROOT / "supervise" / "__pycache__").exists()) else \
            "with whatever .pyc exist"
        print(f"check-in as a command: cd T && {a.python} scripts/checkin.py proj/runs/big ({a.runs} rounds; "
              "python start included)")
        load0 = os.getloadavg()
        for label, env in (("as this environment runs it, " + bytecode, env_here), ("with .pyc", env_pyc)):
            for _, tree in trees:
                subprocess.run([a.python, str(tree / "scripts" / "checkin.py"), str(run)], capture_output=True,
                               env=env_pyc)  # writes the .pyc files under pyc/
            got = {k: ([], []) for k in ["bare"] + [f"{n} {w}" for n, _ in trees for w in ("cold", "warm")]}
            for _ in range(a.runs):
                wall, cpu, _ = run_once([a.python, "-c", "pass"], env, T)
                got["bare"][0].append(wall)
                got["bare"][1].append(cpu)
                for name, tree in trees:
                    cmd = [a.python, str(tree / "scripts" / "checkin.py"), "proj/runs/big"]
                    drop_scan()
                    wall, cpu, out = run_once(cmd, env, T)
                    got[f"{name} cold"][0].append(wall)
                    got[f"{name} cold"][1].append(cpu)
                    append()
                    wall, cpu, out = run_once(cmd, env, T)
                    got[f"{name} warm"][0].append(wall)
                    got[f"{name} warm"][1].append(cpu)
            print(f"  {label}:")
            for k, (walls, cpus) in got.items():
                target = " (target < 0.3 s)" if k.endswith("cold") else " (target < 0.1 s)" if k.endswith("warm") else ""
                print(f"    {k:>16}: {show(walls, cpus)}{target}")
        load1 = os.getloadavg()

        if nan_step is not None:   # a watchdog's first poll reads every notable line: then check-in names it
            from supervise.thresholds import Thresholds
            from supervise.tools.watch import Watchdog
            drop_scan()
            w = Watchdog(run, Thresholds(poll=1, max_stall=1e9, hard_timeout=1e9, orphan_grace=0))
            t0 = time.perf_counter()
            v = w.poll()
            took = time.perf_counter() - t0
            (run / "watchdog.json").unlink(missing_ok=True)
            text = checkin.summary(run)
            assert v.kind == "nan" and "ANOMALY nan" in text and f"at step {nan_step * 10}" in text, text[:300]
            print(f"a NaN in the middle: the cold check-in said what it left out; the watchdog's first poll "
                  f"({took:.2f} s, every notable line) named it, and the check-in after it: {text.splitlines()[0][:60]}")

        # a live watchdog follows the run and kept no scan: head and tail only
        from supervise.contract import atomic_write_json
        drop_scan()
        atomic_write_json(run / "watchdog.json", {"run_dir": str(run), "watchdog_pid": os.getpid(),
                                                  "state": "watching", "last_poll": time.time()})
        watched, read, text = measure(drop_scan)
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
        print(f"load average over the command rounds: {load0[0]:.2f} -> {load1[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

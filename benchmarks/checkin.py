"""What one check-in costs on a 2,000,000-line metrics file beside a 100 MB log, next to the
by-hand reads it replaces (tail -n 50 of both files, and an nvidia-smi-style query).

    python benchmarks/checkin.py [--lines 2000000] [--log-mb 100]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from poll import make_file  # noqa: E402


def rchar() -> int:
    """Bytes this process has read through read(2) so far (Linux /proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(ln for ln in f if ln.startswith("rchar")).split()[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--log-mb", type=int, default=100)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        make_file(run / "metrics.jsonl", a.lines)
        line = b"Epoch 1:  40%|####      | 40/100 [00:04<00:06, 9.8it/s]\r" * 3 + b"step 10 loss 0.3\n"
        with open(run / "train.log", "wb") as f:
            chunk = line * ((1 << 20) // len(line) + 1)
            for _ in range(a.log_mb):
                f.write(chunk[:1 << 20])
        from supervise import checkin
        from supervise.contract import atomic_write_json
        checkin.summary(run)  # warm the imports, as a second check-in would find them

        def measure():
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                before = rchar()
                text = checkin.summary(run)
                read = rchar() - before
                times.append(time.perf_counter() - t0)
            return sorted(times)[2], read, text

        # no watchdog: check-in skims the whole file for notable records (a NaN in the middle)
        alone, alone_read, _ = measure()
        # a live watchdog follows the run (it has seen every record): head and tail only
        atomic_write_json(run / "watchdog.json", {"run_dir": str(run), "watchdog_pid": os.getpid(),
                                                  "state": "watching", "last_poll": time.time()})
        watched, read, text = measure()
        cold = subprocess.run([sys.executable, str(ROOT / "scripts" / "checkin.py"), str(run)],
                              capture_output=True, text=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "scripts" / "checkin.py"), str(run)], capture_output=True)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run(["tail", "-n", "50", str(run / "metrics.jsonl")], capture_output=True)
        subprocess.run(["tail", "-n", "50", str(run / "train.log")], capture_output=True)
        if shutil.which("nvidia-smi"):
            subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total",
                            "--format=csv"], capture_output=True)
        by_hand = time.perf_counter() - t0
        print(f"files: {a.lines:,}-line metrics.jsonl ({(run / 'metrics.jsonl').stat().st_size / 1e6:.0f} MB), "
              f"{a.log_mb} MB train.log")
        print(f"check-in in process, no watchdog (whole file skimmed): median {alone * 1e3:.1f} ms, "
              f"{alone_read / 1024:.0f} KiB read (target < 0.3 s)")
        print(f"check-in in process, a live watchdog beside the run: median {watched * 1e3:.1f} ms, "
              f"{read / 1024:.0f} KiB read, {len(text)} chars out (target < 0.3 s)")
        print(f"check-in as a command (python start included): {cold_s:.2f} s, exit {cold.returncode}")
        print(f"by hand: tail -n 50 of both files{' + nvidia-smi' if shutil.which('nvidia-smi') else ''}: "
              f"{by_hand:.3f} s, and their output is unparsed text")


if __name__ == "__main__":
    main()

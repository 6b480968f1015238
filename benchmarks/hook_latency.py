"""p50 and p95 of one hook decision (a fresh python3 running hooks/pretooluse.py, as Claude Code
runs it) over 100 runs, next to a bare `python3 -c pass` measured the same way in the same run.

    python benchmarks/hook_latency.py [--runs 100]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALLS = [
    {"tool_name": "Bash", "tool_input": {"command": "cd runs\nmkdir -p a\npython train.py", "run_in_background": True}},
    {"tool_name": "Bash", "tool_input": {"command": "tail -n 20 runs/a/metrics.jsonl"}},
    {"tool_name": "Write", "tool_input": {"file_path": "t.py", "content": "TrainingArguments(evaluation_strategy='steps')"}},
]


def timed(cmd, stdin: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    a = p.parse_args()
    hook, bare = [], []
    for i in range(a.runs):  # interleaved, so both see the same machine
        data = json.dumps(CALLS[i % len(CALLS)])
        hook.append(timed([sys.executable, str(ROOT / "hooks" / "pretooluse.py")], data))
        bare.append(timed([sys.executable, "-c", "pass"], ""))
    imports = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "hooks" / "pretooluse.py")],
                             input=json.dumps(CALLS[0]), capture_output=True, text=True).stderr
    heavy = [m for m in ("torch", "pandas", "transformers", "numpy") if f" {m}\n" in imports or f"| {m}\n" in imports]
    print(f"hook decision: p50 {statistics.median(hook) * 1e3:.1f} ms, p95 {pct(hook, 0.95) * 1e3:.1f} ms ({a.runs} runs)")
    print(f"python -c pass: p50 {statistics.median(bare) * 1e3:.1f} ms, p95 {pct(bare, 0.95) * 1e3:.1f} ms")
    print(f"hook cost above a bare interpreter: {(statistics.median(hook) - statistics.median(bare)) * 1e3:.1f} ms (p50)")
    print(f"heavy modules imported by the hook: {heavy or 'none'}")


if __name__ == "__main__":
    main()

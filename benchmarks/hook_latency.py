"""p50 and p95 of one hook decision (a fresh python3 running hooks/pretooluse.py, as Claude Code
runs it) over 100 runs, next to a bare `python3 -c pass` measured the same way in the same run;
then the big commands that once made the guard quadratic (a 1,000-line background command, a
1 MB word, 350 KB of `tmux new`, a 1 MB one-line launch), each timed once through the real hook,
and the in-process decision time at doubling sizes (linear time: each doubling about doubles it).

    python benchmarks/hook_latency.py [--runs 100] [--big-only] [--limit 150] [--root DIR]

Target: every big command decided in under 100 ms of guard time (the in-process figure), well
inside the hook's 10 s timeout.
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


def big_commands(scale: float = 1.0) -> dict:
    """name -> (command, run_in_background): the shapes of the bad-input campaign (issue 12)."""
    n = int(1000 * scale)
    return {
        "1,000-line background command": ("\n".join(f"python train.py --out runs/{i} > runs/{i}.log 2>&1"
                                                    for i in range(n)), True),
        "1 MB word": ("python train.py " + "a" * int((1 << 20) * scale), True),
        "350 KB of `tmux new`": ("tmux new " * int(350 * 1024 * scale / 9), False),
        "1 MB one-line launch": ("python train.py " + " ".join(f"--a{i} {i}" for i in range(int(73_000 * scale))), True),
    }


def timed(cmd, stdin: str, limit: float = 600) -> float:
    t0 = time.perf_counter()
    try:
        subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return float("inf")
    return time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def in_process(root: Path, command: str, background: bool, limit: float) -> float:
    """CPU seconds of one decide() on ``command`` (CPU time: a figure a busy machine does not inflate; a
    fresh interpreter, so that a quadratic case can be cut off)."""
    code = ("import sys, time, json; sys.path.insert(0, sys.argv[1]); from supervise.guard.hook import call_from_hook, decide;"
            "d = json.loads(sys.stdin.read()); c = call_from_hook(d, {}); t = time.process_time(); decide(c);"
            "print(time.process_time() - t)")
    data = json.dumps({"tool_name": "Bash", "tool_input": {"command": command, "run_in_background": background}})
    try:
        p = subprocess.run([sys.executable, "-c", code, str(root)], input=data, capture_output=True, text=True,
                           timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return float("inf")
    return float(p.stdout)


def show(s: float) -> str:
    return "killed at the limit" if s == float("inf") else f"{s * 1e3:,.0f} ms"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--big-only", action="store_true", help="skip the p50/p95 of small calls")
    p.add_argument("--limit", type=float, default=150.0, help="seconds before a big case is cut off (default: 150)")
    p.add_argument("--root", type=Path, default=ROOT, help="the bundle to measure (default: this checkout)")
    a = p.parse_args()
    hook_py = a.root / "hooks" / "pretooluse.py"
    if not a.big_only:
        hook, bare = [], []
        for i in range(a.runs):  # interleaved, so both see the same machine
            data = json.dumps(CALLS[i % len(CALLS)])
            hook.append(timed([sys.executable, str(hook_py)], data))
            bare.append(timed([sys.executable, "-c", "pass"], ""))
        imports = subprocess.run([sys.executable, "-X", "importtime", str(hook_py)],
                                 input=json.dumps(CALLS[0]), capture_output=True, text=True).stderr
        heavy = [m for m in ("torch", "pandas", "transformers", "numpy") if f" {m}\n" in imports or f"| {m}\n" in imports]
        print(f"hook decision: p50 {statistics.median(hook) * 1e3:.1f} ms, p95 {pct(hook, 0.95) * 1e3:.1f} ms ({a.runs} runs)")
        print(f"python -c pass: p50 {statistics.median(bare) * 1e3:.1f} ms, p95 {pct(bare, 0.95) * 1e3:.1f} ms")
        print(f"hook cost above a bare interpreter: {(statistics.median(hook) - statistics.median(bare)) * 1e3:.1f} ms (p50)")
        print(f"heavy modules imported by the hook: {heavy or 'none'}")
    print(f"big commands through the hook (one run each, cut off at {a.limit:g} s):")
    for name, (command, background) in big_commands().items():
        data = json.dumps({"tool_name": "Bash", "tool_input": {"command": command, "run_in_background": background}})
        whole = timed([sys.executable, str(hook_py)], data, a.limit)
        if whole > 10:  # far past the hook's 10 s timeout: not worth a second measure
            print(f"  {name} ({len(command) / 1024:,.0f} KiB): hook {show(whole)}")
            continue
        guard = in_process(a.root, command, background, a.limit)
        print(f"  {name} ({len(command) / 1024:,.0f} KiB): hook {show(whole)} wall, decide() {show(guard)} CPU")
    print("decide() CPU time at doubling sizes (linear: each doubling about doubles the time):")
    for name in big_commands():
        figures = []
        for scale in (0.0625, 0.125, 0.25):
            command, background = big_commands(scale)[name]
            s = in_process(a.root, command, background, a.limit)
            figures.append(f"{len(command) / 1024:,.0f} KiB {show(s)}")
            if s > 10:  # quadratic: the next doubling would take four times as long
                break
        print(f"  {name}: " + ", ".join(figures))


if __name__ == "__main__":
    main()

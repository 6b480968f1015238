"""What one poll over every rank's heartbeat file costs (target: <= 5 ms for 64 ranks), and what
the rank rules and the check-in lines add on top.

    python benchmarks/ranks_poll.py [--ranks 64] [--history 5000] [--polls 200]

Cases: the first poll of a watchdog attached to a long run (each file already holds --history
heartbeats: read from the last MAX_READ bytes only); a steady poll where every rank appended one
heartbeat since the last poll; a poll where nothing changed. Medians and 95th percentiles of
--polls polls, in this process, on files in a temporary folder.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from supervise.observe.ranks import RankFiles, rank_dead, rank_hang, rank_lines, straggler  # noqa: E402


def beat(rank: int, step: int, now: float) -> str:
    return json.dumps({"rank": rank, "local_rank": rank % 8, "host": f"node-{rank // 8:02d}", "pid": 10000 + rank,
                       "step": step, "t": round(step * 0.5, 3), "time": round(now, 3), "sps": 812.4 + rank % 7}) + "\n"


def ms(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1e3:.3f} ms, p95 {xs[int(len(xs) * 0.95) - 1] * 1e3:.3f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--history", type=int, default=5000, help="heartbeats already in each file")
    ap.add_argument("--polls", type=int, default=200)
    a = ap.parse_args()
    if a.ranks < 1 or a.history < 1 or a.polls < 2:
        print("ranks_poll.py: --ranks, --history and --polls must be positive (--polls >= 2)", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "ranks").mkdir()
        t0 = time.time() - a.history
        files = [open(run / "ranks" / f"rank-{r}.jsonl", "a") for r in range(a.ranks)]
        for r, f in enumerate(files):
            f.write("".join(beat(r, s, t0 + s) for s in range(1, a.history + 1)))
            f.flush()
        size = sum((run / "ranks" / f"rank-{r}.jsonl").stat().st_size for r in range(a.ranks))

        first = []
        for _ in range(5):
            t = time.perf_counter()
            state = RankFiles(run).poll()
            first.append(time.perf_counter() - t)
        assert len(state) == a.ranks

        reader = RankFiles(run)
        reader.poll()
        steady, idle, rules, lines = [], [], [], []
        step = a.history
        for _ in range(a.polls):
            step += 1
            now = time.time()
            for r, f in enumerate(files):
                f.write(beat(r, step, now))
                f.flush()
            t = time.perf_counter()
            state = reader.poll()
            steady.append(time.perf_counter() - t)
            t = time.perf_counter()
            reader.poll()
            idle.append(time.perf_counter() - t)
            procs = {10000 + r: "running" for r in range(a.ranks)}
            t = time.perf_counter()
            found = (rank_dead(state, procs) or rank_hang(state, now, procs, stall_s=300)
                     or straggler(state, now, window_s=300))
            rules.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = rank_lines(state, now, procs, stall_s=300)
            lines.append(time.perf_counter() - t)
        assert found is None and all(s.step == step for s in state.values())
        for f in files:
            f.close()

    print(f"{a.ranks} rank files, {a.history} heartbeats each ({size / 1e6:.1f} MB in all), {a.polls} polls")
    print(f"first poll (attach to a long run):  {ms(first)}")
    print(f"steady poll (1 new line per rank):  {ms(steady)}   target <= 5 ms")
    print(f"idle poll (nothing appended):       {ms(idle)}")
    print(f"rank rules (dead, hang, straggler): {ms(rules)}")
    print(f"check-in lines:                     {ms(lines)}  ({sum(len(x) + 1 for x in out)} chars: {out[0][:70]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

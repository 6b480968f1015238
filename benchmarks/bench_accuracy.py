"""How well bench.py's 15-step projection predicts a real run: bench 15 steps of a config, then
run 300 real steps of the same config, and print projected against measured time in one run.

    python benchmarks/bench_accuracy.py [--steps 300] [--seq-len 128] [--batch 32]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervise.tools import bench  # noqa: E402

bench.progress = lambda msg: None  # quiet


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    import torch
    m = bench.measure_model(seq_len=a.seq_len, batch=a.batch, steps=15, warmup=3)
    projected = a.steps * m.batch / m.sps
    model, vocab = bench.build_model(None, 2, a.seq_len)
    t0 = time.perf_counter()
    bench.time_steps(model, vocab, m.batch, a.seq_len, a.steps, 0, "fp32", torch.device(m.device))
    measured = time.perf_counter() - t0
    print(f"config: tiny BERT, seq_len {a.seq_len}, batch {m.batch}, {m.device}")
    print(f"bench (15 steps): {m.sps:.1f} samples/s -> {a.steps} steps projected {projected:.2f} s")
    print(f"real run ({a.steps} steps): {measured:.2f} s")
    print(f"measured / projected = {measured / projected:.3f} ({(measured / projected - 1):+.1%}; target within +-15%)")


if __name__ == "__main__":
    main()

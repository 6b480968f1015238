#!/usr/bin/env python3
"""Bench ~15 real steps and project the run against the window: FITS or DOES NOT FIT.

    python scripts/bench.py --config tiny --seq-len 128 --batch 32 --samples 500000 --window 8h
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

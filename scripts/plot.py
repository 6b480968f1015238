#!/usr/bin/env python3
"""Write RUN_DIR/metrics.png, a phone-friendly snapshot of metrics.jsonl.

    python scripts/plot.py RUN_DIR
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The state of a run in one cheap read (verdict first, at most 1,500 characters).

    python scripts/checkin.py [RUN_DIR] [--json] [--lines K] [--plot]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.checkin import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

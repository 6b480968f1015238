#!/usr/bin/env python3
"""Watch a run directory; exit 0 when it completes, 7 on the first anomaly, 2 on bad usage.

    python -u scripts/watchdog.py RUN_DIR --poll 30 > RUN_DIR/watchdog.log 2>&1
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.watch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

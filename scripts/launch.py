#!/usr/bin/env python3
"""Start a training command detached from the agent's session; print its pid and the watchdog line.

    python3 scripts/launch.py RUN_DIR [--window 8h] [--session-id ID] -- python -u train.py --out RUN_DIR
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.act.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

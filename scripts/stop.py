#!/usr/bin/env python3
"""End a run that scripts/launch.py started: SIGTERM to its process group, a grace, then SIGKILL.

    python3 scripts/stop.py RUN_DIR [--grace 30s]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.act.stop import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

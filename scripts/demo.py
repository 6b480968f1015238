#!/usr/bin/env python3
"""Run the supervision procedure on the shipped task; --fault dead|nan|inverted shows an exit 7.

    python scripts/demo.py [--fault dead]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.demo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

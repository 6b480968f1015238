#!/usr/bin/env python3
"""The smoke preflight: one PASS/FAIL row per check; exit 0 when all pass, 7 otherwise.

    python scripts/smoke.py runs/smoke -- python -u train.py --out runs/smoke --smoke
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.smoke import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drop invalid rows of a code corpus in parallel, keeping raw and normalized variants aligned.

    python scripts/audit.py corpus.jsonl --code-col code --normalize black --out audited
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from supervise.tools.audit import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PreToolUse hook (Bash, Write, Edit, MultiEdit): stdin JSON -> supervise.guard.hook -> deny or allow."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the plugin's own copy of the library

try:
    from supervise.guard.hook import main
except Exception as e:  # a broken install must not block the agent: allow, and say so
    print(f"supervise guard: not loaded ({type(e).__name__}); allowing", file=sys.stderr)
    sys.exit(0)

if __name__ == "__main__":
    sys.exit(main())

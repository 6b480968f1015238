"""The guard: the PreToolUse hooks (``hook``) that refuse a bad launch, a read of a secret or a
flood of a log, each with its fix.

May import: the contract layer and ``act`` (the launcher's line, on the deny path only); never
``tools`` (tests/test_layers.py). Runs on every tool call: standard library only."""

"""The guard: the PreToolUse hook (``hook``: the rule table, ``decide``, ``main``) that refuses a
bad launch, a read of a secret or a flood of a log, each with its fix. One module per concern,
over one split of the command (``shell``): launch shapes and the launcher's line as their fix
(``launches``), log dumps (``logs``), secrets (``secrets``), transformers v4 arguments under v5
(``transformers``).

May import: the contract layer and ``act`` (the launcher's line, on the deny path only); never
``tools`` (tests/test_layers.py). Runs on every tool call: standard library only."""

"""Judge: one rule table (``table``) over one frozen ``Observation``, one ``Verdict``, pure: no
file, process or clock is read there. ``assess`` is one look for the one-shot tools (the observer
once, then the table).

May import: the contract layer and ``supervise.observe`` (the Observation's types, and the
domain knowledge each rule applies); never ``act``, ``tools`` or ``guard`` (tests/test_layers.py)."""

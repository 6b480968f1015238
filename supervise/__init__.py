"""supervising-training-runs: telemetry contract, anomaly rules and the tools around them.

The house, one folder per layer, ground first; a module imports only from its own layer or
below (``LAYERS``; tests/test_layers.py enforces it, ``python benchmarks/house.py`` measures it):

- ``supervise/`` itself, the contract and its writers: ``vocabulary`` (file names, exit codes,
  the quiet variables, ``GONE``, ``Anomaly``, the bundle's folder), ``thresholds`` (every
  threshold, a flag each), ``cli`` (the one error boundary, argument types), ``contract``
  (records, the tail reader, atomic writes), and what a training script imports: ``telemetry``
  (standard library only, copied beside a plain loop), ``hf`` and ``lightning``;
- ``observe/``: one frozen ``Observation`` per poll (``observe.observer``);
- ``judge/``: the one rule table over it, one ``Verdict``, pure (``judge.table``);
- ``act/``: launch, stop, the relaunch line;
- ``guard/``: the PreToolUse hooks;
- ``tools/``: the front doors (watch, checkin, smoke, bench, audit, plot, demo).

The hot paths (watchdog, check-in, hooks) use only the standard library, plus psutil and
nvidia-ml-py when they are installed."""
__version__ = "0.1.0"

LAYERS = ("", "observe", "judge", "act", "guard", "tools")   # ground first; "" is supervise/ itself

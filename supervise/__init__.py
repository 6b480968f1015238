"""supervising-training-runs: telemetry contract, anomaly rules and the tools around them.

The house, ground floor first; a module imports only from its own floor or below
(``python benchmarks/house.py`` measures it):

- ground: ``vocabulary`` (file names, exit codes, the quiet variables, ``GONE``, ``Anomaly``),
  ``thresholds`` (every threshold, a flag each), ``cli`` (the one error boundary, argument
  types), ``contract`` (records, the tail reader, atomic writes), ``probes`` (processes and
  their one liveness test, GPU, disk), ``state`` (watchdog.json and launch.json, typed),
  ``observation`` (the frozen ``Observation`` and ``Verdict``), ``registry``, ``telemetry``;
- knowledge: ``logs``, ``rules`` (the record rules), ``scan`` (what a scan learned, kept beside
  watchdog.json), ``ranks``, ``slurm``, ``checkpoints``, ``stacks`` (a hang's stacks: the capture
  and the phrase that names the frames), ``volumes`` (the free space of the volumes a run writes
  to, whatever fills them);
- engine: ``engine`` (observe), ``judge`` (the one rule table, and the verdict), ``recovery``
  (the relaunch line), ``launch`` and ``stop``;
- front doors: ``watch``, ``checkin``, ``plot``, ``smoke``, ``bench``, ``audit``, ``demo``,
  ``guard`` (the hooks), and the integrations ``hf`` and ``lightning``.

The hot paths (watchdog, check-in, hooks) use only the standard library, plus psutil and
nvidia-ml-py when they are installed."""
__version__ = "0.1.0"

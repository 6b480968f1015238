"""Observe: read what a run left and what runs now, and freeze it into one ``Observation`` per
poll (``observer.Observer``). Processes and their one liveness test (``probes``), the launch
and watchdog records (``state``, ``registry``), train.log (``logs``), the records folded through
the record rules and the stall clock (``records``, kept between looks by ``scan``), ranks'
heartbeats (``ranks``), checkpoints (``checkpoints``), the volumes a run fills (``volumes``), a
hang's stacks (``stacks``) and the schedulers (``engines``: one module per engine, one
registration).

May import: the contract layer (``supervise.vocabulary``, ``thresholds``, ``cli``, ``contract``)
and its own modules; never ``judge``, ``act``, ``tools`` or ``guard``
(tests/test_layers.py)."""

"""Act: start a run (``launch``: the one launcher, launch.json), stop it (``stop``), and write the
move after a verdict (``recovery``: the relaunch line, the watchdog line beside it).

May import: the contract layer, ``observe`` and ``judge``; never ``tools`` or ``guard``
(tests/test_layers.py). ``launch`` and ``stop`` are also front doors (their ``main``)."""

"""The front doors: ``watch`` (the watchdog), ``checkin``, ``smoke``, ``bench``, ``audit``,
``plot`` and ``demo``. Each is argument parsing, one call into the layers below, an exit code;
``cli.front_door`` turns every error into one line, once.

May import: every layer below (tests/test_layers.py); nothing imports a front door."""

"""The end-to-end session: a real Airflow with the executor under test, workers killed on purpose.

One module per concern, each usable and tested on its own:

- ``cli``: ``python -m tools e2e`` options, to an :class:`~tools.measure.e2e.driver.Options`;
- ``session``: the one session runner of the e2e and the soak (venv, servers, stages, signals);
- ``driver``: the scenarios, each a ``Scenario`` (a fresh stack per scenario, the killers, the report);
- ``judge``: whether a scenario passed, from the API's task states and the driver's kill (pure);
- ``venv``: the line's Airflow environment with the overlay (or stage K) installed;
- ``lock``: ``constraints/e2e-<line>.txt``, that environment as of the line's release day;
- ``stack``: db migrate, api-server, scheduler, dag-processor (and PostgreSQL), stopped by pid;
- ``watch``: polling the REST API until the run is final or its deadline passes (``web``: the HTTP call);
- ``procfs``: processes (psutil, and /proc for what it lacks): the worker to kill, a deadlock by its wchans;
- ``timeline``: the per-try timeline and summary text.
"""

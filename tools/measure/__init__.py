"""Measurement: what the series costs and whether it holds under load, faults and a model.

``bench`` with ``bench_probe`` and ``bench_loop``, ``chaos`` with ``chaos_probe`` (the probes run
inside a stage venv, loaded by file path), ``model`` (the SPIN models) and ``e2e`` (a real
Airflow, workers killed on purpose). Imports ``tools.shared``, ``tools.engine`` and
``tools.delivery``.
"""

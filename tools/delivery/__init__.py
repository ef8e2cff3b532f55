"""Delivery: the series taken to its users and upstream.

``overlay_install`` and ``package`` (the overlay into an installed Airflow, or as a wheel),
``backport`` (the series onto a backport branch), ``pr`` with ``pr_testrun``, ``pr_evidence`` and
``pr_internals`` (one patch as an upstream PR), ``lineform`` (a line's words in a clone),
``upstream_prs`` (the standalone PRs) and ``newsfragments``. Imports ``tools.shared`` and
``tools.engine``.
"""

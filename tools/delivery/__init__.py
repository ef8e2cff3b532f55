"""Delivery: the series taken to its users and upstream.

``wheels`` with ``wheels_check`` and ``install_commands`` (Airflow's own wheels with the series'
files, and the commands that install them), ``package`` (the overlay as a provider package),
``backport`` (the series onto a backport branch), ``pr`` with ``pr_testrun``, ``pr_evidence`` and
``pr_internals`` (one patch as an upstream PR), ``lineform`` (a line's words in a clone),
``upstream_prs`` (the standalone PRs) and ``newsfragments``. Imports ``tools.shared`` and
``tools.engine``.
"""

"""pytest plugin loaded by verify (``-p tools.engine.fixed_by_plugin``): records, per test, the
patch its ``fixed_by`` marker names (its ``introduced_by`` and ``lines``, if any) and its outcome,
into the JSON file named by ``$LEPATCH_VERIFY_RECORD``. Outcomes: ``pass``, ``fail`` (the
test itself failed, a timeout included), ``error`` (setup or teardown failed), ``skip``, and
``n/a``: the test failed only because the stage lacks an attribute it drives (an
``AttributeError`` for a name a later patch adds): the test cannot run there, which is not a
reproduction of the bug.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

# why: no runtime pytest import, so `python -m tools` (which imports this for RECORD_ENV)
# works in an environment without pytest.
RECORD_ENV = "LEPATCH_VERIFY_RECORD"
_records: dict[str, dict[str, Any]] = {}
# "AttributeError: 'LocalExecutor' object has no attribute '_handle_result'": an internal of a later stage.
_CANNOT_RUN = re.compile(r"^AttributeError: .*object has no attribute '\w+'")


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        # why every item: ``verify --own-tests`` collects a stage's unmarked tests as well.
        rec = _records.setdefault(item.nodeid, {})
        marker = item.get_closest_marker("fixed_by")
        if marker is not None:
            patch = marker.args[0] if marker.args else marker.kwargs.get("patch")
            rec["fixed_by"] = patch
            # A bug that an earlier patch of the series introduced: the test fails only from
            # that patch until the one that fixes it.
            if introduced := marker.kwargs.get("introduced_by"):
                rec["introduced_by"] = introduced
            # A bug only some lines have (task-sdk 1.4's posix_spawn, say): elsewhere the test must pass.
            if lines := marker.kwargs.get("lines"):
                rec["lines"] = list(lines)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    rec = _records.setdefault(report.nodeid, {})
    if report.failed:
        rec["outcome"] = "fail" if report.when == "call" else rec.get("outcome", "error")
        crash = getattr(report.longrepr, "reprcrash", None)
        if report.when == "call" and crash is not None and _CANNOT_RUN.match(str(crash.message)):
            rec["outcome"] = "n/a"
            rec["why"] = str(crash.message)
        if report.when != "call" and rec["outcome"] != "fail":
            rec["outcome"] = "error"
    elif report.skipped:
        rec.setdefault("outcome", "skip")
    elif report.when == "call":
        rec.setdefault("outcome", "pass")


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_records, f, indent=2, sort_keys=True)

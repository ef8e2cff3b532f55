"""pytest plugin loaded by ``verify --own-tests`` (``-p tools.engine.start_method_plugin``): runs only
the start methods ``$LEPATCH_START_METHODS`` names (``fork``, ``fork,spawn``), whatever the stage's
own conftest parametrizes.

The final ``tests/executor/conftest.py`` reads the variable itself, but the test files of an earlier
stage may predate it (stages 4-7's conftest parametrizes ``start_method`` with fork and spawn
unconditionally), so the stage's tests are deselected here by their ``start_method`` parameter, as
the final conftest would not have generated them. Tests without that parameter are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

ENV = "LEPATCH_START_METHODS"


def allowed_methods(value: str | None) -> frozenset[str]:
    """The start methods a ``LEPATCH_START_METHODS`` value names; empty (no filter) when unset."""
    return frozenset(m.strip() for m in (value or "").split(",") if m.strip())


def deselected(params: Mapping[str, object], allowed: Collection[str]) -> bool:
    """Whether a test with these parameters runs a start method ``allowed`` leaves out."""
    method = params.get("start_method")
    return bool(allowed) and isinstance(method, str) and method not in allowed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    allowed = allowed_methods(os.environ.get(ENV))
    if not allowed:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        (drop if callspec is not None and deselected(callspec.params, allowed) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

"""The e2e driver's options as the report tests build them: a throughput run at parallelism 16 on 3.3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.measure.e2e import driver
from tools.shared import pins


def e2e_options(**kw: Any) -> driver.Options:
    """``driver.Options`` with the tests' defaults, any field overridden by ``kw``."""
    base: dict[str, Any] = dict(
        line=pins.get_line("3.3"),
        stage=None,
        db="sqlite",
        parallelism=16,
        scenarios=["throughput"],
        deadline=120.0,
        stop_bound=30.0,
        task_seconds=2.0,
        out=Path("/nonexistent"),
    )
    return driver.Options(**{**base, **kw})

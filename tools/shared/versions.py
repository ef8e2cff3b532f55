"""
How the tools order Airflow release versions: one key for core and task-sdk releases alike.

The forms apache-airflow-core and apache-airflow-task-sdk use on PyPI: 3.1.8, 3.4.0b2, 3.3.1rc2,
3.0.0rc1.post4, 1.3.2. ``version_key`` orders them as PEP 440 does (3.4.0b2 < 3.4.0), without a
dependency beyond the standard library (the tools venv of ``tests/tools`` has only pytest).
"""

from __future__ import annotations

import re

from tools.shared.errors import ToolError

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?$")
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}
FINAL_RANK = 3


def version_key(version: str) -> tuple[int, int, int, int, int, int]:
    """(major, minor, micro, pre-release rank, its number, post): a final release ranks above its betas."""
    m = _VERSION.match(version)
    if not m:
        raise ToolError(f"{version}: not a release version this tool understands")
    major, minor, micro, pre, pre_n, post = m.groups()
    rank = _PRE_RANK[pre] if pre else FINAL_RANK
    return (int(major), int(minor), int(micro), rank, int(pre_n or 0), int(post or 0))


def is_release(version: str) -> bool:
    return _VERSION.match(version) is not None


def is_prerelease(version: str) -> bool:
    return version_key(version)[3] != FINAL_RANK

"""
How the tools order Airflow release versions: one key for core and task-sdk releases alike.

The forms apache-airflow-core and apache-airflow-task-sdk use on PyPI: 3.1.8, 3.4.0b2, 3.3.1rc2,
3.0.0rc1.post4, 1.3.2. ``version_key`` is their PEP 440 ``packaging.version.Version`` (3.4.0b2 <
3.4.0); packaging is in every environment that imports the tools (nox, pytest and pip need it).
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from tools.shared.errors import ToolError


def _release(version: str) -> Version | None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    # why: dev, local and epoch versions, and forms PEP 440 normalises, are nothing Airflow releases
    if len(parsed.release) != 3 or parsed.dev is not None or parsed.local or parsed.epoch:
        return None
    return parsed if str(parsed) == version else None


def version_key(version: str) -> Version:
    """The release as PEP 440 orders it; a final release ranks above its betas and rcs."""
    parsed = _release(version)
    if parsed is None:
        raise ToolError(f"{version}: not a release version this tool understands")
    return parsed


def is_release(version: str) -> bool:
    return _release(version) is not None


def is_prerelease(version: str) -> bool:
    return version_key(version).is_prerelease

"""``conf_vars``: override Airflow config options for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


def _env_name(section: str, key: str) -> str:
    return f"AIRFLOW__{section.upper()}__{key.upper()}"


def _confs() -> list[object]:
    """Every config object Airflow reads: core's, and task-sdk's own where it has one (task-sdk 1.2+
    reads ``airflow.sdk.configuration.conf``, a separate parser)."""
    from airflow.configuration import conf

    out: list[object] = [conf]
    try:
        from airflow.sdk.configuration import conf as sdk_conf
    except ImportError:
        return out
    if sdk_conf is not conf:
        out.append(sdk_conf)
    return out


@contextlib.contextmanager
def conf_vars(overrides: Mapping[tuple[str, str], str | None]) -> Iterator[None]:
    """Set each ``(section, key)`` to its value (``None``: unset it) in Airflow's config, then put
    back what was there. An environment variable for the option is hidden meanwhile, since it
    would win over the config."""
    saved: list[tuple[object, tuple[str, str], str | None]] = []
    saved_env: dict[str, str] = {}
    for (section, key), value in overrides.items():
        name = _env_name(section, key)
        if name in os.environ:
            saved_env[name] = os.environ.pop(name)
        for conf in _confs():
            had = conf.has_section(section) and conf.has_option(section, key)  # type: ignore[attr-defined]
            saved.append((conf, (section, key), conf.get(section, key) if had else None))  # type: ignore[attr-defined]
            _set(conf, section, key, value)
    try:
        yield
    finally:
        for conf, (section, key), value in reversed(saved):
            _set(conf, section, key, value)
        os.environ.update(saved_env)


def _set(conf: object, section: str, key: str, value: str | None) -> None:
    if value is None:
        if conf.has_option(section, key):  # type: ignore[attr-defined]
            conf.remove_option(section, key)  # type: ignore[attr-defined]
        return
    if not conf.has_section(section):  # type: ignore[attr-defined]
        conf.add_section(section)  # type: ignore[attr-defined]
    conf.set(section, key, value)  # type: ignore[attr-defined]

"""``python -m tools e2e-lock``: each line's e2e environment, resolved as of that release's day.

A real Airflow of an older line does not start with today's dependencies (3.2.2's api-server
and dag-processor die at import with pydantic 2.14.4). Airflow's own constraint files are not
reachable here, so the environment is resolved the way a user who installed the release then
got it: ``uv pip compile --exclude-newer`` at the upload time of the release's files, read
from PyPI's simple JSON API (PEP 691/700), plus :data:`MARGIN` (a release's distributions are
uploaded one after another). The result is ``constraints/e2e-<line>.txt``, which
:mod:`tools.measure.e2e.venv` installs with in preference to the line's test constraints.

``--core X`` locks another core release the line covers the same way, as of X's day, into
``constraints/e2e-<X>.txt``, which ``e2e --core X`` needs: a base's lock can pin what an older
release refuses (3.3.2's aiosqlite 0.22.1; 3.3.0 requires <0.22.0) or does not start with (3.1.8's
pyjwt 2.11.0: 3.1.6's api-server fails every token with "Issuer (iss) must be a string").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tools.engine import fetch
from tools.engine.lock import compile_requirements
from tools.engine.venvs import oldest_python
from tools.measure.e2e import web
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

SIMPLE_URL = "https://pypi.org/simple/{name}/"
MARGIN = timedelta(hours=1)
# Airflow itself (the distribution that brings the task SDK, the standard provider and the
# PostgreSQL driver) and the core wheel the series patches: both are released together.
RELEASED_TOGETHER = ("apache-airflow", pins.DISTRIBUTION)

# Reads a project's simple-API JSON page; the tests hand in a fake.
SimplePage = Callable[[str], dict[str, Any]]


def pypi_simple(name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = web.call(
            SIMPLE_URL.format(name=name),
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
            timeout=60,
        )
    except (OSError, ValueError) as exc:
        raise ToolError(f"cannot read {SIMPLE_URL.format(name=name)} (PyPI simple JSON API): {exc}") from exc
    return data


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def upload_time(page: dict[str, Any], name: str, version: str, wheel_sha256: str | None = None) -> datetime:
    """When the last file of ``name`` ``version`` was uploaded; checks the pinned wheel on the way."""
    prefix = f"{name.replace('-', '_')}-{version}"
    files = [
        f
        for f in page.get("files", [])
        if str(f.get("filename", "")).startswith((prefix + "-", prefix + ".tar.gz")) and not f.get("yanked")
    ]
    times = [_parse_time(f["upload-time"]) for f in files if f.get("upload-time")]
    if not times:
        raise ToolError(f"{name} {version}: no files with an upload time on the index")
    if wheel_sha256 is not None:
        wheel = fetch.wheel_filename(version)
        got = next((f["hashes"].get("sha256") for f in files if f["filename"] == wheel), None)
        if got != wheel_sha256:
            raise ToolError(
                f"{name} {version}: the index lists {wheel} with sha256 {got}, pinned {wheel_sha256}"
            )
    return max(times)


def release_cutoff(line: pins.Line, simple: SimplePage = pypi_simple, core: str | None = None) -> datetime:
    """The instant the line's release (or its release ``core``) was complete on the index, plus
    :data:`MARGIN`."""
    core = core or line.version
    sha = line.wheel_sha256 if core == line.version else line.covers[core]
    times = [
        upload_time(simple(name), name, core, sha if name == pins.DISTRIBUTION else None)
        for name in RELEASED_TOGETHER
    ]
    return max(times) + MARGIN


def constraints_path(
    line: pins.Line, layout: Layout = DEFAULT, celery: bool = False, core: str | None = None
) -> Path:
    """``constraints/e2e-<line>.txt``; with ``celery``, ``e2e-celery-<line>.txt`` (the CeleryExecutor's);
    for another core release of the line, its version in place of the line's name (``e2e-3.3.0.txt``)."""
    name = line.name if core in (None, line.version) else core
    return layout.constraints / (f"e2e-celery-{name}.txt" if celery else f"e2e-{name}.txt")


def extras(celery: bool = False) -> str:
    """The extras of ``apache-airflow`` an e2e environment installs (``celery``: the provider too)."""
    return "postgres,celery" if celery else "postgres"


def lock_line(
    line: pins.Line,
    layout: Layout = DEFAULT,
    simple: SimplePage = pypi_simple,
    compile_: Callable[..., str] = compile_requirements,
    celery: bool = False,
    core: str | None = None,
) -> Path:
    """Write ``constraints/e2e-<line>.txt``: Airflow and every dependency as of the release.

    With ``celery``, ``constraints/e2e-celery-<line>.txt``: the same with ``apache-airflow[celery]``,
    so ``apache-airflow-providers-celery`` (and celery, kombu, billiard, redis) are the releases
    that were current on the line's release day, resolved together with it. With ``core`` (another
    release the line covers), that release as of its own day: ``constraints/e2e-<core>.txt``."""
    core = core or line.version
    cutoff = release_cutoff(line, simple, core=core)
    stamp = cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")
    wheel = (
        fetch.ensure_wheel(line, layout)
        if core == line.version
        else fetch.ensure_pin(line.pins[0], core, layout)
    )
    python = oldest_python(wheel)
    command = f"python -m tools e2e-lock --line {line.name}" + (" --celery" if celery else "")
    if core != line.version:
        command += f" --core {core}"
    requirements = [f"apache-airflow[{extras(celery)}]=={core}", f"{pins.DISTRIBUTION}=={core}"]
    text = compile_(requirements, command, python, exclude_newer=stamp)
    if not re.search(rf"^apache-airflow=={re.escape(core)}\s*$", text, re.M):
        raise ToolError(f"uv pip compile for the {line.name} line did not pin apache-airflow=={core}")
    if celery and not re.search(r"^apache-airflow-providers-celery==", text, re.M):
        raise ToolError(
            f"uv pip compile for the {line.name} line did not pin apache-airflow-providers-celery"
        )
    target = constraints_path(line, layout, celery, core)
    target.parent.mkdir(parents=True, exist_ok=True)
    what = (" with CeleryExecutor" if celery else "") + (
        f" on apache-airflow-core {core}" if core != line.version else ""
    )
    head = f"# The e2e environment of {line.label}{what}, as of {stamp} (its release on PyPI + {MARGIN}).\n"
    target.write_text(head + text)
    return target

"""Pinned wheels: download once into the cache, verify sha256, read the upstream files' bases.

``ensure_wheel("3.3")`` (a line name or any pinned version) returns the cached
apache-airflow-core wheel, downloading it with pip when missing; ``ensure_pin(pin)`` does the
same for any distribution a line pins (task-sdk for the supervisor). A wheel whose sha256
differs from ``tools/shared/pins.py`` is refused and removed, so the cache only ever holds verified
wheels. ``read_bases(line)`` gives every pinned upstream file of a line at its repository path.
"""

from __future__ import annotations

import email.message
import email.parser
import functools
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from tools.shared import pins, table
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.pins import Line, Pin


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pinned_wheel(line_or_version: Line | str) -> tuple[str, str]:
    """(version, expected wheel sha256) for a line, a line name or a covered version."""
    if isinstance(line_or_version, Line):
        return line_or_version.version, line_or_version.wheel_sha256
    line = pins.get_line(line_or_version)
    if line_or_version in line.covers:
        return line_or_version, line.covers[line_or_version]
    return line.version, line.wheel_sha256


def wheel_filename(version: str, distribution: str = pins.DISTRIBUTION) -> str:
    return f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"


def pip_download(
    version: str, dest: Path, distribution: str = pins.DISTRIBUTION, *, sdist: bool = False
) -> None:
    """``distribution==version``'s wheel (``sdist``: its source archive) into ``dest``, by pip."""
    # why isolation for an sdist: pip builds its metadata with the project's own build backend
    form = ["--no-binary=:all:"] if sdist else ["--only-binary=:all:", "--no-build-isolation"]
    spec = f"{distribution}=={version}"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        *form,
        "--disable-pip-version-check",
        "--quiet",
    ]
    cmd += [spec, "-d", str(dest)]
    # why: a machine-wide pip constraint file (PIP_CONSTRAINT or pip.conf) may not cover
    # or may even contradict the exact pin; the sha256 check is the pin that matters here.
    env = dict(os.environ, PIP_CONSTRAINT="", PIP_REQUIRE_VIRTUALENV="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "No module named pip" in last:
            last += " (use a Python with pip: `python -m tools venv --line tools` fetches every pin)"
        raise ToolError(
            f"cannot download {spec}: pip exited {proc.returncode}: {last}\n"
            f"  to reproduce: {cmd[0]} -m pip download --no-deps {form[0]} {spec} -d DIR"
        )


# Downloads ``version``'s wheel into an empty directory (pip by default, a fake in tests).
Download = Callable[[str, Path], None]


def download_one(version: str, dest: Path, download: Download, distribution: str = pins.DISTRIBUTION) -> Path:
    """Download into the empty ``dest`` and return the one wheel that arrived."""
    download(version, dest)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        names = ", ".join(w.name for w in wheels) or "nothing"
        raise ToolError(f"pip download of {distribution}=={version} produced {names}")
    return wheels[0]


def unpinned_path(version: str, layout: Layout = DEFAULT) -> Path:
    """Where ``pins --discover``/``--bump`` keep wheels no pin vouches for yet (apart from the cache)."""
    return layout.cache / "unpinned" / wheel_filename(version)


def _refuse(path: Path, version: str, expected: str, got: str, distribution: str) -> ToolError:
    path.unlink(missing_ok=True)
    return ToolError(
        f"refusing {distribution} {version}: wheel sha256 is {got}, pinned {expected} "
        "(removed from the cache)"
    )


def ensure_wheel(line_or_version: Line | str, layout: Layout = DEFAULT) -> Path:
    """The verified wheel of a pinned version in the cache, downloading it if needed."""
    version, expected = pinned_wheel(line_or_version)
    return ensure_verified(version, expected, layout)


def ensure_verified(
    version: str,
    expected: str,
    layout: Layout = DEFAULT,
    download: Download | None = None,
    distribution: str = pins.DISTRIBUTION,
) -> Path:
    """The cached wheel of ``version`` whose sha256 is ``expected``, downloading it if needed."""
    cache = layout.cache
    target = cache / wheel_filename(version, distribution)
    if target.exists():
        got = sha256_file(target)
        if got != expected:
            raise _refuse(target, version, expected, got, distribution)
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # why: a release discover downloaded before it was pinned need not be fetched again; the
    # pin is checked all the same, and a stale download is simply replaced.
    seen = unpinned_path(version, layout) if distribution == pins.DISTRIBUTION else None
    if seen is not None and seen.is_file():
        if sha256_file(seen) == expected:
            os.replace(seen, target)
            return target
        seen.unlink()
    fetch_one = download or (
        pip_download
        if distribution == pins.DISTRIBUTION
        else functools.partial(pip_download, distribution=distribution)
    )
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        wheel = download_one(version, Path(tmp), fetch_one, distribution)
        got = sha256_file(wheel)
        if got != expected:
            raise _refuse(wheel, version, expected, got, distribution)
        os.replace(wheel, target)
    return target


def ensure_pin(pin: Pin, version: str | None = None, layout: Layout = DEFAULT) -> Path:
    """The verified wheel of a pin's base (or of a release it covers) in the cache."""
    version = version or pin.version
    expected = pin.wheel_sha256 if version == pin.version else pin.covers[version]
    return ensure_verified(version, expected, layout, distribution=pin.file.distribution)


def ensure_every_pin(layout: Layout = DEFAULT) -> list[Path]:
    """Every line's pinned wheels in the cache: run it where pip is (the tools' test venv has none)."""
    return [
        ensure_pin(pin, version, layout=layout)
        for line in pins.LINES
        for pin in (*line.pins, *line.sdk_release_pins)
        for version in (pin.version, *pin.covers)
    ]


def wheel_metadata(wheel: Path) -> email.message.Message:
    """The wheel's ``.dist-info/METADATA`` headers (empty when it has none)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode() if meta else ""
    return email.parser.HeaderParser().parsestr(text)


def requires_python(wheel: Path) -> str:
    """The wheel's ``Requires-Python`` (``>=3.10`` when it says nothing)."""
    return str(wheel_metadata(wheel).get("Requires-Python", ">=3.10")).strip()


def required_sdk(wheel: Path) -> str | None:
    """The task-sdk release a core wheel requires exactly (``Requires-Dist: ...==X``), if any."""
    for row in wheel_metadata(wheel).get_all("Requires-Dist", []):
        if pins.SUPERVISOR.distribution in row:
            m = re.search(r"==\s*([\w.]+)", row)
            return m.group(1) if m else None
    return None


def read_source(wheel: Path, package_path: str = pins.PACKAGE_PATH) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(package_path)
        except KeyError:
            raise ToolError(f"{wheel.name} has no {package_path}") from None


def read_pinned(pin: Pin, layout: Layout = DEFAULT) -> bytes:
    """A pin's upstream file from its base wheel, checked against the pinned sha256."""
    data = read_source(ensure_pin(pin, layout=layout), pin.file.package_path)
    got = sha256_bytes(data)
    if got != pin.source_sha256:
        raise ToolError(
            f"{pin.file.package_path} in {pin.file.distribution} {pin.version} has sha256 {got}, "
            f"pinned {pin.source_sha256}"
        )
    return data


def read_bases(line: Line | str, layout: Layout = DEFAULT) -> dict[str, bytes]:
    """Every upstream file a line pins, at its path in Airflow's repository."""
    if not isinstance(line, Line):
        line = pins.get_line(line)
    return {pin.file.repo_path: read_pinned(pin, layout) for pin in line.pins}


def read_base(line: Line | str, layout: Layout = DEFAULT) -> bytes:
    """``local_executor.py`` of a line's base wheel, checked against its pinned sha256."""
    if not isinstance(line, Line):
        line = pins.get_line(line)
    return read_pinned(line.pins[0], layout)


def check_pins(layout: Layout = DEFAULT, out: object = None) -> bool:
    """Download every covered release and compare its upstream file with its line's base."""
    rows: list[tuple[str, str, str, str, str, str]] = []
    ok = True
    for line in pins.LINES:
        for pin in (*line.pins, *line.sdk_release_pins):
            for version in [pin.version, *sorted(pin.covers)]:
                what = f"{pin.file.distribution} {version}"
                try:
                    wheel = ensure_pin(pin, version, layout)
                    src = read_source(wheel, pin.file.package_path)
                except ToolError as exc:
                    rows.append((line.name, what, pin.file.name, "REFUSED", "-", str(exc).splitlines()[0]))
                    ok = False
                    continue
                digest = sha256_bytes(src)
                same = digest == pin.source_sha256
                ok &= same
                rows.append(
                    (line.name, what, pin.file.name, "ok", digest[:16], "same" if same else "DIFFERS")
                )
                if pin.file is pins.EXECUTOR:
                    # why: the overlay picks the supervisor by the task-sdk a core release requires
                    needs = required_sdk(wheel)
                    agrees = needs == line.core_sdk.get(version)
                    ok &= agrees
                    verdict = "requires " + (needs or "?") + ("" if agrees else " (pins.core_sdk DIFFERS)")
                    rows.append((line.name, what, "task-sdk", "ok", "-", verdict))
    header = ("line", "release", "file", "wheel", "sha256", "vs base")
    print("\n".join(table.render([header, *rows])))
    return ok

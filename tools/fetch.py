"""Pinned wheels: download once into the cache, verify sha256, read the executor's base source.

``ensure_wheel("3.3")`` (a line name or any pinned version) returns the cached wheel,
downloading it with pip when missing. A wheel whose sha256 differs from ``tools/pins.py``
is refused and removed, so the cache only ever holds verified wheels.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from tools import pins
from tools.errors import ToolError
from tools.layout import DEFAULT, Layout
from tools.pins import Line


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


def wheel_filename(version: str) -> str:
    return f"{pins.DISTRIBUTION.replace('-', '_')}-{version}-py3-none-any.whl"


def pip_download(version: str, dest: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-build-isolation",
        "--disable-pip-version-check",
        "--quiet",
        f"{pins.DISTRIBUTION}=={version}",
        "-d",
        str(dest),
    ]
    # why: a machine-wide pip constraint file (PIP_CONSTRAINT or pip.conf) may not cover
    # or may even contradict the exact pin; the sha256 check is the pin that matters here.
    env = dict(os.environ, PIP_CONSTRAINT="", PIP_REQUIRE_VIRTUALENV="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ToolError(
            f"cannot download {pins.DISTRIBUTION}=={version}: pip exited {proc.returncode}: {last}\n"
            f"  to reproduce: {' '.join(cmd[:1])} -m pip download --no-deps --only-binary=:all: "
            f"{pins.DISTRIBUTION}=={version} -d DIR"
        )


# Downloads ``version``'s wheel into an empty directory (pip by default, a fake in tests).
Download = Callable[[str, Path], None]


def download_one(version: str, dest: Path, download: Download) -> Path:
    """Download into the empty ``dest`` and return the one wheel that arrived."""
    download(version, dest)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        names = ", ".join(w.name for w in wheels) or "nothing"
        raise ToolError(f"pip download of {pins.DISTRIBUTION}=={version} produced {names}")
    return wheels[0]


def unpinned_path(version: str, layout: Layout = DEFAULT) -> Path:
    """Where ``pins --discover``/``--bump`` keep wheels no pin vouches for yet (apart from the cache)."""
    return layout.cache / "unpinned" / wheel_filename(version)


def _refuse(path: Path, version: str, expected: str, got: str) -> ToolError:
    path.unlink(missing_ok=True)
    return ToolError(
        f"refusing {pins.DISTRIBUTION} {version}: wheel sha256 is {got}, pinned {expected} "
        "(removed from the cache)"
    )


def ensure_wheel(line_or_version: Line | str, layout: Layout = DEFAULT) -> Path:
    """The verified wheel of a pinned version in the cache, downloading it if needed."""
    version, expected = pinned_wheel(line_or_version)
    return ensure_verified(version, expected, layout)


def ensure_verified(
    version: str, expected: str, layout: Layout = DEFAULT, download: Download | None = None
) -> Path:
    """The cached wheel of ``version`` whose sha256 is ``expected``, downloading it if needed."""
    cache = layout.cache
    target = cache / wheel_filename(version)
    if target.exists():
        got = sha256_file(target)
        if got != expected:
            raise _refuse(target, version, expected, got)
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # why: a release discover downloaded before it was pinned need not be fetched again; the
    # pin is checked all the same, and a stale download is simply replaced.
    seen = unpinned_path(version, layout)
    if seen.is_file():
        if sha256_file(seen) == expected:
            os.replace(seen, target)
            return target
        seen.unlink()
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        wheel = download_one(version, Path(tmp), download or pip_download)
        got = sha256_file(wheel)
        if got != expected:
            raise _refuse(wheel, version, expected, got)
        os.replace(wheel, target)
    return target


def read_source(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(pins.PACKAGE_PATH)
        except KeyError:
            raise ToolError(f"{wheel.name} has no {pins.PACKAGE_PATH}") from None


def read_base(line: Line | str, layout: Layout = DEFAULT) -> bytes:
    """``local_executor.py`` of a line's base wheel, checked against its pinned sha256."""
    if not isinstance(line, Line):
        line = pins.get_line(line)
    data = read_source(ensure_wheel(line, layout))
    got = sha256_bytes(data)
    if got != line.source_sha256:
        raise ToolError(
            f"{pins.PACKAGE_PATH} in {pins.DISTRIBUTION} {line.version} has sha256 {got}, "
            f"pinned {line.source_sha256}"
        )
    return data


def check_pins(layout: Layout = DEFAULT, out: object = None) -> bool:
    """Download every covered version and compare its executor source with its line's base."""
    rows: list[tuple[str, str, str, str, str]] = []
    ok = True
    for line in pins.LINES:
        for version in [line.version, *sorted(line.covers)]:
            try:
                src = read_source(ensure_wheel(version, layout))
            except ToolError as exc:
                rows.append((line.name, version, "REFUSED", "-", str(exc).splitlines()[0]))
                ok = False
                continue
            digest = sha256_bytes(src)
            same = digest == line.source_sha256
            ok &= same
            rows.append((line.name, version, "ok", digest[:16], "same" if same else "DIFFERS"))
    header = ("line", "version", "wheel", "local_executor.py sha256", "vs base")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return ok

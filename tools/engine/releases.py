"""``python -m tools pins``: every release of each pinned line on the index, held against its base.

``discover`` lists the index's releases of each line, hashes the ``local_executor.py`` of
each one's wheel and sorts them into the ones that carry the line's base byte for byte (an
overlay verified on the base is valid for them: they go into ``covers``) and the ones that
differ (``nox -s overlay`` refuses them and names the release to upgrade to). ``bump``
moves a line to a newer base, e.g. the 3.4 line from 3.4.0b2 to 3.4.0.

``tools/shared/pins.py`` stays the one source of truth and is never edited by hand for these: its
``LINES`` assignment is rendered from ``Line`` values, the rest of the file is kept as it is,
and the new file is executed and compared with what was meant before it replaces the old.
The index is reached through :class:`Index`, so the tests hand in a fake one.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from tools.engine import fetch
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.pins import Line
from tools.shared.table import render
from tools.shared.versions import is_prerelease, is_release, version_key

PINS_FILE = Path(pins.__file__)


def line_of(version: str) -> str:
    """The release line a version belongs to: "3.1.3" -> "3.1"."""
    return ".".join(str(n) for n in version_key(version).release[:2])


def verified_versions(line: Line) -> list[str]:
    """The base and every covered release, oldest first."""
    return sorted([line.version, *line.covers], key=version_key)


def nearest_verified(version: str, lines: Sequence[Line] = pins.LINES) -> tuple[Line, str] | None:
    """The oldest verified release newer than ``version``: the smallest upgrade that is served.

    The same line is preferred; a version above every verified release of its line (or on no
    pinned line) gets the oldest verified release of a newer line. None if nothing is newer.
    """
    key = version_key(version)
    candidates = [(ln, v) for ln in lines for v in verified_versions(ln) if version_key(v) > key]
    if not candidates:
        return None
    own = [(ln, v) for ln, v in candidates if ln.name == line_of(version)]
    return min(own or candidates, key=lambda c: version_key(c[1]))


# ------------------------------------------------------------------------ the index


class Index(Protocol):
    """The package index, as far as pins need it."""

    def versions(self) -> list[str]:
        """Every release of the distribution, pre-releases included."""

    def download(self, version: str, dest: Path) -> None:
        """Download the wheel of ``version`` into the empty directory ``dest``."""


class PipIndex:
    """The configured index, through pip (the only client that is sure to be there)."""

    def versions(self) -> list[str]:
        cmd = [sys.executable, "-m", "pip", "index", "versions", "--pre", pins.DISTRIBUTION]
        # why: a machine-wide pip constraint would hide the releases it does not allow.
        env = dict(os.environ, PIP_CONSTRAINT="", PIP_DISABLE_PIP_VERSION_CHECK="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        found = re.search(r"^Available versions:\s*(.+)$", proc.stdout, re.MULTILINE)
        if proc.returncode != 0 or not found:
            last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
            raise ToolError(f"cannot list {pins.DISTRIBUTION} releases: `{' '.join(cmd[1:])}`: {last}")
        return [v.strip() for v in found.group(1).split(",") if v.strip()]

    def download(self, version: str, dest: Path) -> None:
        fetch.pip_download(version, dest)


def unpinned_wheel(version: str, index: Index, layout: Layout = DEFAULT) -> Path:
    """The wheel of a release that is not pinned (yet), kept apart from the verified cache.

    Its hash is whatever the index served (pip checks it against the index's own sha256);
    once it is pinned, :func:`tools.engine.fetch.ensure_wheel` checks it and adopts it.
    """
    target = fetch.unpinned_path(version, layout)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        os.replace(fetch.download_one(version, Path(tmp), index.download), target)
    return target


def release_wheel(version: str, index: Index, lines: Sequence[Line], layout: Layout = DEFAULT) -> Path:
    """A pinned release through the verified cache, any other through :func:`unpinned_wheel`."""
    for ln in lines:
        expected = ln.wheel_sha256 if version == ln.version else ln.covers.get(version)
        if expected:
            return fetch.ensure_verified(version, expected, layout, index.download)
    return unpinned_wheel(version, index, layout)


# ------------------------------------------------------------------------ discover


@dataclass(frozen=True)
class Release:
    line: str
    version: str
    verdict: str  # BASE, SAME, DIFFERS, SKIPPED or MISSING (below)
    wheel_sha256: str = ""
    source_sha256: str = ""
    pinned: bool = False


BASE, SAME, DIFFERS, SKIPPED, MISSING = "base", "same as base", "DIFFERS", "pre-release, skipped", "MISSING"


def discover(index: Index, lines: Sequence[Line] = pins.LINES, layout: Layout = DEFAULT) -> list[Release]:
    """Every index release of every line, judged against the line's base (newest first).

    A pre-release of a line whose base is final is listed but not fetched: nobody should run
    a release candidate once the release is out. A pinned release the index no longer has
    (yanked) is MISSING.
    """
    available = [v for v in index.versions() if is_release(v)]
    rows: list[Release] = []
    for line in lines:
        verified = set(verified_versions(line))
        mine = sorted({v for v in available if line_of(v) == line.name} | verified, key=version_key)
        for version in reversed(mine):
            pinned = version in verified
            if version not in available:
                rows.append(Release(line.name, version, MISSING, pinned=pinned))
                continue
            if is_prerelease(version) and not line.prerelease:
                rows.append(Release(line.name, version, SKIPPED, pinned=pinned))
                continue
            wheel = release_wheel(version, index, lines, layout)
            source = fetch.sha256_bytes(fetch.read_source(wheel))
            same = source == line.source_sha256
            verdict = BASE if version == line.version else (SAME if same else DIFFERS)
            rows.append(Release(line.name, version, verdict, fetch.sha256_file(wheel), source, pinned))
    return rows


def with_discovered(lines: Sequence[Line], rows: Iterable[Release]) -> tuple[Line, ...]:
    """The lines with every release that carries its base added to ``covers``."""
    found: dict[str, dict[str, str]] = {}
    for row in rows:
        if row.verdict == SAME:
            found.setdefault(row.line, {})[row.version] = row.wheel_sha256
    return tuple(
        dataclasses.replace(ln, covers=_sorted_covers({**ln.covers, **found.get(ln.name, {})}))
        for ln in lines
    )


def format_table(rows: Sequence[Release]) -> str:
    """One row per release; a line's skipped pre-releases share one row at its end, they are many."""
    header = ("line", "version", "wheel sha256", "local_executor.py sha256", "vs base", "pins")
    table = [header]
    for name in dict.fromkeys(r.line for r in rows):
        mine = [r for r in rows if r.line == name]
        for r in mine:
            if r.verdict != SKIPPED:
                pinned = "pinned" if r.pinned else ("new" if r.verdict == SAME else "-")
                table.append(
                    (
                        r.line,
                        r.version,
                        r.wheel_sha256[:12] or "-",
                        r.source_sha256[:12] or "-",
                        r.verdict,
                        pinned,
                    )
                )
        skipped = sorted((r.version for r in mine if r.verdict == SKIPPED), key=version_key)
        if skipped:
            span = f"{skipped[0]}..{skipped[-1]} ({len(skipped)})" if len(skipped) > 1 else skipped[0]
            table.append((name, span, "-", "-", SKIPPED, "-"))
    return "\n".join(render(table))


def _summary(lines: Sequence[Line], rows: Sequence[Release]) -> list[str]:
    """What the table means for an operator of each line, one sentence per line."""
    out = []
    for line in lines:
        mine = [r for r in rows if r.line == line.name]
        differs = sorted((r.version for r in mine if r.verdict == DIFFERS), key=version_key)
        newer = [v for v in differs if version_key(v) > version_key(line.version)]
        older = [v for v in differs if v not in newer]
        served = ", ".join(verified_versions(with_discovered([line], mine)[0]))
        text = f"{line.label}: served {served}"
        if older:
            text += f"; refused with a way forward: {', '.join(older)} (another local_executor.py)"
        if newer:
            text += f"; NEWER than the base with another file: {', '.join(newer)}"
            text += f" (`python -m tools pins --bump {line.name} {newer[-1]}`)"
        missing = [r.version for r in mine if r.verdict == MISSING]
        if missing:
            text += f"; pinned but not on the index (yanked?): {', '.join(missing)}"
        out.append(text)
    return out


# ------------------------------------------------------------------------ bump


def bump(
    line_name: str,
    version: str,
    index: Index,
    lines: Sequence[Line] = pins.LINES,
    layout: Layout = DEFAULT,
) -> tuple[tuple[Line, ...], list[str]]:
    """The lines with ``line_name`` moved to ``version``, and what changed, in words.

    The old base (and what it covered) stays covered only if the new release carries the
    same ``local_executor.py``; otherwise the overlay was never verified for the new file.
    """
    by_name = {ln.name: ln for ln in lines}
    if line_name not in by_name:
        raise ToolError(f"unknown release line {line_name!r}; pinned lines: {', '.join(by_name)}")
    line = by_name[line_name]
    if not is_release(version) or line_of(version) != line.name:
        raise ToolError(f"{pins.DISTRIBUTION} {version} is not a release of the {line.name} line")
    if version_key(version) <= version_key(line.version):
        raise ToolError(
            f"{pins.DISTRIBUTION} {version} is not newer than the {line.name} line's base {line.version}"
        )
    available = index.versions()
    if version not in available:
        have = ", ".join(v for v in available if is_release(v) and line_of(v) == line.name) or "none"
        raise ToolError(
            f"{pins.DISTRIBUTION} {version} is not on the package index (the {line.name} line has: {have})"
        )
    wheel = unpinned_wheel(version, index, layout)
    source = fetch.sha256_bytes(fetch.read_source(wheel))
    same = source == line.source_sha256
    covers = _sorted_covers({**line.covers, line.version: line.wheel_sha256}) if same else {}
    # why: the API server's file is pinned on the base release alone; a new base brings its own
    auth = (
        fetch.sha256_bytes(fetch.read_source(wheel, pins.AUTH_MANAGER.package_path))
        if line.auth_source_sha256
        else ""
    )
    core_sources = {
        f.name: fetch.sha256_bytes(fetch.read_source(wheel, f.package_path))
        for f in (pins.SCHEDULER, pins.BASE_EXECUTOR)
        if f.name in line.core_sources
    }
    new = dataclasses.replace(
        line,
        version=version,
        wheel_sha256=fetch.sha256_file(wheel),
        source_sha256=source,
        covers=covers,
        prerelease=is_prerelease(version),
        auth_source_sha256=auth,
        core_sources=core_sources,
    )
    notes = [f"{line.label} -> {new.label}: wheel {new.wheel_sha256[:12]}, {pins.PACKAGE_PATH} {source[:12]}"]
    if auth and auth != line.auth_source_sha256:
        notes.append(f"{pins.AUTH_MANAGER.package_path} differs from {line.version}'s: {auth[:12]}")
    for name, digest in core_sources.items():
        if digest != line.core_sources[name]:
            notes.append(f"{name} differs from {line.version}'s: {digest[:12]}")
    if same:
        notes.append(f"same {pins.PACKAGE_PATH} as {line.version}: covers {', '.join(covers)}")
    else:
        dropped = ", ".join(verified_versions(line))
        notes.append(
            f"{pins.PACKAGE_PATH} differs from {line.version}'s: no longer covered: {dropped}; "
            "the series must be applied to the new base (resolutions may be needed)"
        )
    notes.append(
        f"next: python -m tools lock --line {line.name}; nox -s apply -- --line {line.name}; "
        f"nox -s apply -- --write; nox -s verify -- --line {line.name}"
    )
    return tuple(new if ln.name == line.name else ln for ln in lines), notes


def _sorted_covers(covers: dict[str, str]) -> dict[str, str]:
    return {v: covers[v] for v in sorted(covers, key=version_key)}


# ------------------------------------------------------------------------ tools/shared/pins.py


def render_lines(lines: Sequence[Line]) -> str:
    """The ``LINES = (...)`` statement, formatted as ruff format leaves it."""
    out = ["LINES: tuple[Line, ...] = ("]
    for line in lines:
        out.append("    Line(")
        for f in dataclasses.fields(Line):
            value = getattr(line, f.name)
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if has_default and value == default:
                continue  # the file states only what differs from the dataclass
            out.extend(_render_field(f.name, value))
        out.append("    ),")
    out.append(")")
    return "\n".join(out) + "\n"


def _render_field(name: str, value: Any) -> list[str]:
    if isinstance(value, dict):
        items = [f"            {_quote(k)}: {_quote(v)}," for k, v in value.items()]
        return [f"        {name}={{", *items, "        },"]
    if isinstance(value, bool):
        return [f"        {name}={value!r},"]
    if isinstance(value, str):
        return [f"        {name}={_quote(value)},"]
    raise ToolError(f"{PINS_FILE}: cannot render Line.{name} of type {type(value).__name__}")


def _quote(text: str) -> str:
    if not re.fullmatch(r"[\w.+-]*", text):
        raise ToolError(f"{PINS_FILE}: refusing to write {text!r} into a pin (unexpected characters)")
    return f'"{text}"'


def pins_text(text: str, lines: Sequence[Line], path: Path = PINS_FILE) -> str:
    """``text`` (the pins module's source) with its LINES assignment replaced by ``lines``."""
    found = [
        node
        for node in ast.parse(text).body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "LINES"
    ]
    if len(found) != 1 or found[0].end_lineno is None:
        raise ToolError(f"{path}: expected exactly one `LINES: tuple[Line, ...] = (...)` assignment")
    node = found[0]
    old = text.splitlines(keepends=True)
    new = "".join([*old[: node.lineno - 1], render_lines(lines), *old[node.end_lineno :]])
    # why: a rewrite that parsed differently from what was meant must never reach the disk.
    check = types.ModuleType("tools._pins_readback")
    sys.modules[check.__name__] = check  # dataclasses look their module up while decorating
    try:
        exec(compile(new, str(path), "exec"), check.__dict__)
    finally:
        del sys.modules[check.__name__]
    got = [dataclasses.asdict(ln) for ln in check.LINES]
    if got != [dataclasses.asdict(ln) for ln in lines]:
        raise ToolError(f"{path}: the rewritten LINES do not read back as written; nothing changed")
    return new


def write_pins(lines: Sequence[Line], path: Path = PINS_FILE) -> bool:
    """Rewrite the LINES of ``path`` in one rename; False if they are already that."""
    text = path.read_text()
    new = pins_text(text, lines, path)
    if new == text:
        return False
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(new)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


# ------------------------------------------------------------------------ commands


def run_discover(
    *,
    write: bool,
    index: Index | None = None,
    lines: Sequence[Line] | None = None,
    path: Path | None = None,
    layout: Layout = DEFAULT,
    out: TextIO | None = None,
) -> int:
    def say(text: str) -> None:
        print(text, file=out or sys.stdout)

    lines = pins.LINES if lines is None else lines
    path = PINS_FILE if path is None else path
    rows = discover(index or PipIndex(), lines, layout)
    say(format_table(rows))
    say("")
    for text in _summary(lines, rows):
        say(text)
    new = sorted(
        (r for r in rows if r.verdict == SAME and not r.pinned), key=lambda r: version_key(r.version)
    )
    if not new:
        say(f"{path.name}: every release that carries its line's base is already covered")
    elif not write:
        say(f"not covered yet: {', '.join(r.version for r in new)} (--write records them in {path.name})")
    elif write_pins(with_discovered(lines, rows), path):
        say(f"wrote {path}: covers now include {', '.join(r.version for r in new)}")
    return 0


def run_bump(
    line_name: str,
    version: str,
    *,
    index: Index | None = None,
    lines: Sequence[Line] | None = None,
    path: Path | None = None,
    layout: Layout = DEFAULT,
    out: TextIO | None = None,
) -> int:
    lines = pins.LINES if lines is None else lines
    path = PINS_FILE if path is None else path
    new_lines, notes = bump(line_name, version, index or PipIndex(), lines, layout)
    write_pins(new_lines, path)
    for note in notes:
        print(note, file=out or sys.stdout)
    print(f"wrote {path}", file=out or sys.stdout)
    return 0


def _cmd_pins(args: argparse.Namespace) -> int:
    if args.write and not args.discover:
        raise ToolError("pins: --write records what --discover finds; pass both")
    if args.discover:
        return run_discover(write=args.write)
    if args.bump:
        return run_bump(*args.bump)
    if not args.check:
        for line in pins.LINES:
            covers = ", ".join(sorted(line.covers, key=version_key)) or "-"
            print(f"{line.label}  {line.branch}  covers: {covers}")
        return 0
    ok = fetch.check_pins()
    print("all covered versions carry their line's base" if ok else "FAILED: pins check")
    return 0 if ok else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pins",
        help="show the pinned lines; --check proves covered versions share a base; --discover, --bump",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="download every covered version and compare hashes"
    )
    mode.add_argument(
        "--discover",
        action="store_true",
        help="hash local_executor.py of every release of each line on the index against the line's base",
    )
    mode.add_argument(
        "--bump",
        nargs=2,
        metavar=("LINE", "VERSION"),
        help="move LINE's base to VERSION (e.g. --bump 3.4 3.4.0) and rewrite tools/shared/pins.py",
    )
    p.add_argument(
        "--write", action="store_true", help="with --discover: record identical releases in covers"
    )
    p.set_defaults(func=_cmd_pins)

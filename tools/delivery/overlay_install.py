"""Install the patched upstream files into an operator's Airflow environment, reversibly.

The overlay of a release line (``airflow_overlay/<line>/``) holds the fully patched
``airflow/executors/local_executor.py`` and task-sdk's ``airflow/sdk/execution_time/supervisor.py``.
They replace the installed files only when the environment is exactly what the overlay was
verified for: an apache-airflow-core version that is pinned (a line's version or one it
``covers``), an apache-airflow-task-sdk version the line pins (or one in its ``sdk_covers``),
and each file byte-identical to its pinned base. Either check failing refuses the whole install:
the two files are verified together. Everything the install did is written down in a state
directory inside the environment::

    <sys.prefix of the env>/lepatch-overlay/
        record.json                 what was installed where, and the hashes on both sides
        local_executor.py.orig      each original file, byte for byte
        supervisor.py.orig

so ``restore`` can put the originals back exactly and ``status`` can tell whether a file
was changed since. ``status`` also recognises Airflow's own wheels rebuilt with the series' files
(``nox -s wheels``: a version ``X+lepatch.N`` and a ``lepatch.json`` in its dist-info): state
``wheel``, each file checked against the hash the wheel recorded; ``install`` refuses there.
The record's ``state`` is written *before* the files are swapped (``installing``) and flipped
to ``installed`` after the smoke dispatch passed: an install that was killed half-way is
visible, and ``restore`` undoes it. ``restore --force`` over a
file edited since keeps that edit in ``lepatch-overlay/kept/<file>.<time>.<sha256>``.

Inspecting the environment never imports Airflow: versions and file locations come from the
distributions' metadata (``python -I``, so PYTHONPATH cannot point elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import enum
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tools.delivery import wheels
from tools.engine import apply, releases
from tools.shared import pins, versions
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT

OVERLAY_DIR = LAYOUT.overlay
SMOKE_SCRIPT = LAYOUT.tests_executor / "harness.py"
STATE_DIR_NAME = "lepatch-overlay"
RECORD_NAME = "record.json"
BACKUP_NAME = "local_executor.py.orig"
KEPT_DIR_NAME = "kept"  # why: restore --force must not lose an operator's edit of a file
SMOKE_TIMEOUT = 180.0

# Runs inside the target environment: for each (distribution, file), its version and path, and the
# record a patched wheel carries in its dist-info (tools.delivery.wheels), if any.
_INSPECT = """
import importlib.metadata as md, importlib.util, json, sys
out = {"prefix": sys.prefix, "files": [], "pip": importlib.util.find_spec("pip") is not None}
for dist_name, path in %(wanted)r:
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        out["files"].append([None, None, None])
    else:
        out["files"].append([dist.version, str(dist.locate_file(path)), dist.read_text(%(record)r)])
print(json.dumps(out))
"""


class OverlayError(ToolError):
    """A refusal or failure; the message is one line naming the path at fault."""


class OverlayState(enum.Enum):
    """What ``status`` finds; the record's ``state`` field holds INSTALLING or INSTALLED."""

    PRISTINE = "pristine"  # no record, every file is its pinned base
    INSTALLING = "installing"  # an install was interrupted between swap and smoke result
    INSTALLED = "installed"  # the recorded overlay is in place, unchanged
    MODIFIED = "modified"  # the recorded overlay was installed, a file changed since
    REVERTED = "reverted"  # a record exists but the files are the bases again (package reinstalled?)
    FOREIGN = "foreign"  # no record and a file is not its pinned base: patched by someone else
    UNPINNED = "unpinned"  # an installed version is not one the overlays were verified for
    WHEEL = "wheel"  # the patched wheels (nox -s wheels) are installed, each file as they recorded

    @property
    def healthy(self) -> bool:
        return self in (OverlayState.PRISTINE, OverlayState.INSTALLED, OverlayState.WHEEL)


@dataclass
class Installed:
    """One upstream file as the environment has it."""

    file: pins.UpstreamFile
    version: str | None  # its distribution's version; None when the distribution is missing
    target: Path
    wheel_record: dict[str, Any] | None = None  # lepatch.json of a patched wheel (tools.delivery.wheels)

    @property
    def site(self) -> Path:
        """The directory the distribution's files are installed under."""
        return Path(str(self.target)[: -len(self.file.package_path)])

    @property
    def backup_name(self) -> str:
        return f"{self.file.name}.orig"


@dataclass
class Environment:
    python: Path
    prefix: Path
    files: list[Installed]  # the executor first
    has_pip: bool = True  # why: advice names `python -m pip install`, or uv's where there is no pip

    def pip_install(self, *requirements: str) -> str:
        """The command that installs ``requirements`` into this environment, as an operator types it."""
        quoted = " ".join(f"'{r}'" for r in requirements)
        if self.has_pip:
            return f"{self.python} -m pip install {quoted}"
        return f"uv pip install --python {self.python} {quoted}"

    @property
    def version(self) -> str:
        """The apache-airflow-core version: it decides the line."""
        return self.files[0].version or "?"

    @property
    def target(self) -> Path:
        """The installed local_executor.py."""
        return self.files[0].target

    @property
    def state_dir(self) -> Path:
        return self.prefix / STATE_DIR_NAME


@dataclass
class FileRecord:
    file: str  # UpstreamFile.name
    distribution: str
    version: str
    target: str
    backup: str
    original_sha256: str
    overlay_sha256: str
    overlay_source: str


@dataclass
class OverlayRecord:
    state: str  # OverlayState.INSTALLING.value or OverlayState.INSTALLED.value
    line: str
    version: str  # apache-airflow-core's
    python: str
    installed_at: str
    files: list[FileRecord] = field(default_factory=list)
    schema: int = 2

    @classmethod
    def load(cls, path: Path) -> OverlayRecord:
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            if data.get("schema") == 1:  # one file, its fields at the top
                one = {k: data.pop(k) for k in ("target", "backup", "original_sha256", "overlay_sha256")}
                one["overlay_source"] = data.pop("overlay_source")
                data["files"] = [
                    {
                        "file": pins.EXECUTOR.name,
                        "distribution": pins.DISTRIBUTION,
                        "version": data["version"],
                        **one,
                    }
                ]
                data["schema"] = 2
            data["files"] = [FileRecord(**f) for f in data.get("files", [])]
            return cls(**data)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise OverlayError(f"{path}: unreadable overlay record ({exc}); inspect it by hand") from exc

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def of(self, name: str) -> FileRecord | None:
        return next((f for f in self.files if f.file == name), None)


@dataclass
class Status:
    state: OverlayState
    env: Environment
    line: pins.Line | None
    record: OverlayRecord | None
    current: dict[str, str]  # UpstreamFile.name -> sha256 of the installed file
    why: str = ""  # UNPINNED, FOREIGN: which file and why, one sentence

    @property
    def current_sha256(self) -> str:
        return self.current.get(pins.EXECUTOR.name, "")

    def describe(self) -> str:
        where = f"{self.env.prefix} (apache-airflow-core {self.env.version})"
        rec = self.record
        if self.state is OverlayState.PRISTINE:
            names = ", ".join(f.file.name for f in self.env.files)
            return f"none: {names} in {where} are the pinned {self.line.name if self.line else '?'} bases"
        if self.state is OverlayState.INSTALLED and rec:
            names = ", ".join(f.file for f in rec.files)
            return f"overlay {rec.line} ({names}) installed {rec.installed_at} in {where}; unchanged since"
        if self.state is OverlayState.MODIFIED and rec:
            return f"overlay {rec.line} installed {rec.installed_at} in {where}, but {self.why}"
        if self.state is OverlayState.INSTALLING and rec:
            return f"an install of overlay {rec.line} into {where} was interrupted: run restore"
        if self.state is OverlayState.REVERTED:
            stale = self.env.state_dir
            return f"none: {where} has the pinned bases again, but a stale record is left in {stale}"
        if self.state is OverlayState.FOREIGN:
            return f"unknown: {self.why} and no overlay record exists (patched by hand?)"
        if self.state is OverlayState.WHEEL:
            return f"patched wheels (no overlay) in {self.env.prefix}: {self.why}"
        if self.state is OverlayState.MODIFIED:
            return f"patched wheels in {self.env.prefix}, but {self.why}"
        return f"unsupported: {self.why}"


def unpinned_refusal(
    version: str,
    current_sha256: str,
    lines: Sequence[pins.Line] = pins.LINES,
    env: Environment | None = None,
) -> str:
    """Why ``version`` gets no overlay, and the release to move to, in one sentence.

    An overlay is verified against one ``local_executor.py`` and the release it came in; a
    release with another file (3.1.0-3.1.3 on the 3.1 line) would need a base of its own and
    the series applied and verified there, so it is refused with the nearest verified
    release named, the smallest upgrade that is served.
    """
    refusing = "refusing, nothing changed"
    if not versions.is_release(version):
        return f"{pins.DISTRIBUTION} {version} is not a release any overlay is verified for; {refusing}"
    line = next((ln for ln in lines if ln.name == releases.line_of(version)), None)
    nearest = releases.nearest_verified(version, lines)
    if line is not None and versions.version_key(version) > versions.version_key(line.version):
        if current_sha256 == line.source_sha256:
            return (
                f"{pins.DISTRIBUTION} {version} ships the same local_executor.py as {line.version} "
                f"(the {line.name} line's base) but is not recorded as verified: record it with "
                f"`python -m tools pins --discover --write` in the series checkout; {refusing}"
            )
        return (
            f"{pins.DISTRIBUTION} {version} is newer than {line.version} (the {line.name} line's base) "
            f"and ships another local_executor.py, for which no overlay is verified yet "
            f"(`python -m tools pins --bump {line.name} {version}`, then apply and verify the series); "
            f"stay on {line.version} until then; {refusing}"
        )
    if nearest is None:
        newest = max((ln.version for ln in lines), key=versions.version_key)
        return (
            f"{pins.DISTRIBUTION} {version} is newer than every pinned line (newest: {newest}); "
            f"no overlay is verified for it; {refusing}"
        )
    to_line, to_version = nearest
    verified = ", ".join(releases.verified_versions(to_line))
    # why both: core pins its task-sdk exactly, so naming the pair is what pip accepts as written
    pair = [f"{pins.DISTRIBUTION}=={to_version}"]
    if to_version in to_line.core_sdk:
        pair.append(f"{pins.SUPERVISOR.distribution}=={to_line.core_sdk[to_version]}")
    command = env.pip_install(*pair) if env else "pip install " + " ".join(f"'{r}'" for r in pair)
    way = (
        f"upgrade to {to_version}, the nearest verified release "
        f"({'same line' if line is to_line else f'the {to_line.name} line'}; verified: {verified}): "
        f"`{command}`, then install again; {refusing}"
    )
    if line is None:
        return f"{pins.DISTRIBUTION} {version} is on no pinned release line; {way}"
    if current_sha256 == line.source_sha256:
        return (
            f"{pins.DISTRIBUTION} {version} ships the same local_executor.py as {line.version} "
            f"(the {line.name} line's base) but is not recorded as verified "
            f"(`python -m tools pins --discover --write` would check it); or {way}"
        )
    return (
        f"{pins.DISTRIBUTION} {version} ships a different local_executor.py than {line.version} "
        f"(the {line.name} line's base; sha256 {current_sha256[:12]}, base {line.source_sha256[:12]}), "
        f"so no overlay is verified for it; {way}"
    )


def interpreter_problem(python: Path) -> str | None:
    """Why ``python`` cannot be run as an interpreter, in one line naming the fix; None if it can."""
    if not python.exists():
        return f"{python}: no such interpreter; pass the environment's python (ENV/bin/python)"
    if python.is_dir():
        inside = next(
            (python / c for c in ("bin/python", "Scripts/python.exe") if (python / c).is_file()), None
        )
        hint = f"--python {inside}" if inside else "--python DIR/bin/python, its interpreter"
        return f"{python}: a directory, not an interpreter; pass {hint}"
    if not os.access(python, os.X_OK):
        return f"{python}: not executable; pass the environment's interpreter (ENV/bin/python)"
    return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def _write_atomically(path: Path, data: bytes, mode_from: Path | None = None) -> None:
    """Replace ``path`` in one rename, so a reader sees the old or the new file, never half of one."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".lepatch-tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if mode_from is not None and mode_from.exists():
            shutil.copymode(mode_from, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _wheel_record(target: Path, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        data: dict[str, Any] = json.loads(text)
    except ValueError as exc:
        raise OverlayError(
            f"{target}: its distribution's {wheels.RECORD_NAME} is unreadable ({exc})"
        ) from exc
    return data


def sdk_refusal(line: pins.Line, env: Environment, version: str | None) -> str:
    """Why the installed task-sdk gets no overlay, and commands that work as written.

    Each apache-airflow-core release requires one task-sdk release exactly, so the advice names
    the pair that core release requires (pip refuses any other task-sdk beside it), or the line's
    base pair; where the installed task-sdk is the one its core requires (a release the pins do
    not know yet), also the executor's fixes alone, with task-sdk's supervisor left as it is.
    """
    dist = pins.SUPERVISOR.distribution
    core = env.version
    refusing = "refusing, nothing changed"
    pair = line.core_sdk.get(core)
    # why only then: beside a task-sdk its core does not require, the executor may not even import
    alone = (
        "or install the executor's fixes alone, task-sdk's supervisor fix left out: "
        f"`nox -s overlay -- install --only executor --python {env.python}`; {refusing}"
        if version is not None and version == pair
        else refusing
    )
    if pair not in line.sdk_versions:
        core, pair = line.version, line.sdk_version
    fix = env.pip_install(f"{pins.DISTRIBUTION}=={core}", f"{dist}=={pair}")
    if version is None:
        return (
            f"{dist} is not installed, and the {line.name} overlay patches its {pins.SUPERVISOR.name}: "
            f"`{fix}` (the pair apache-airflow-core {core} requires), then install again; {alone}"
        )
    return (
        f"{dist} {version} is not a release the {line.name} overlay is verified with "
        f"(verified: {', '.join(line.sdk_versions)}): `{fix}` (the pair apache-airflow-core {core} "
        f"requires), then install again; {alone}"
    )


def drop_bytecode(target: Path) -> list[Path]:
    """Remove ``__pycache__/<stem>.*.pyc``: an unchecked-hash pyc would keep running the old code."""
    removed = []
    for pyc in sorted((target.parent / "__pycache__").glob(f"{target.stem}.*.pyc")):
        pyc.unlink()
        removed.append(pyc)
    return removed


class OverlayInstaller:
    """Install, inspect and restore the overlay in the environment of one Python interpreter."""

    def __init__(
        self,
        python: Path,
        *,
        overlay_dir: Path = OVERLAY_DIR,
        smoke_script: Path = SMOKE_SCRIPT,
        smoke_timeout: float = SMOKE_TIMEOUT,
        out: TextIO | None = None,
        only: pins.UpstreamFile | None = None,
    ) -> None:
        self.python = Path(python)
        self.only = only  # install this upstream file alone (an executor's host, or a Celery worker's)
        self.overlay_dir = overlay_dir
        self.smoke_script = smoke_script
        self.smoke_timeout = smoke_timeout
        self._out = out

    def say(self, message: str) -> None:
        print(message, file=self._out or sys.stdout)

    # ---------------------------------------------------------------- inspection

    def inspect(self) -> Environment:
        if problem := interpreter_problem(self.python):
            raise OverlayError(problem)
        wanted = [(f.distribution, f.package_path) for f in pins.UPSTREAM_FILES]
        try:
            proc = subprocess.run(
                [str(self.python), "-I", "-c", _INSPECT % {"wanted": wanted, "record": wheels.RECORD_NAME}],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise OverlayError(f"{self.python}: cannot run it to inspect the environment ({exc})") from exc
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise OverlayError(f"{self.python}: inspecting the environment failed: {last}")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        files = []
        for f, (version, located, wheel_text) in zip(pins.UPSTREAM_FILES, data["files"], strict=True):
            if version is None and f is pins.EXECUTOR:
                raise OverlayError(f"{self.python}: {f.distribution} is not installed in {data['prefix']}")
            target = Path(located).resolve() if located else Path(data["prefix"]) / f.package_path
            if version is not None and not target.is_file() and f.pinned_on_base_only:
                version = None  # a core release without it: the overlay replaces it only where pinned
            if version is not None and not target.is_file():
                raise OverlayError(
                    f"{target}: {f.distribution} {version} is installed but this file is missing"
                )
            record = _wheel_record(target, wheel_text) if wheels.is_patched(version) else None
            files.append(Installed(f, version, target, record))
        return Environment(self.python, Path(data["prefix"]), files, bool(data.get("pip", True)))

    def overlay_path(
        self, line: pins.Line, file: pins.UpstreamFile = pins.EXECUTOR, sdk_version: str | None = None
    ) -> Path:
        """The overlay's file; a task-sdk release the line's base does not ship has its own supervisor."""
        pin = line.supervisor_pin(sdk_version) if file is pins.SUPERVISOR else None
        if pin is not None and pin != line.pin(file):
            return self.overlay_dir / line.name / apply.sdk_release_dir(pin.version) / file.package_path
        return self.overlay_dir / line.name / file.package_path

    def _members(self, env: Environment, line: pins.Line) -> list[tuple[Installed, pins.Pin | None]]:
        """The files this line's overlay replaces: each one the line pins and the overlay carries,
        with the base it was verified on (None: the installed release has no verified overlay)."""
        out: list[tuple[Installed, pins.Pin | None]] = []
        for inst in env.files:
            if self.only is not None and inst.file is not self.only:
                continue
            pin = line.pin(inst.file)
            if inst.file is pins.EXECUTOR:
                out.append((inst, pin))
            elif pin is None or not self.overlay_path(line, inst.file).is_file():
                continue
            elif inst.file is pins.SUPERVISOR:
                out.append((inst, line.supervisor_pin(inst.version)))
            elif inst.version == pin.version:
                # why only the base release: the line's other core releases ship their own
                # versions of the API server's files, and the overlay was verified on the base's
                out.append((inst, pin))
        return out

    def status(self, env: Environment | None = None) -> Status:
        env = env or self.inspect()
        current = {f.file.name: sha256(f.target.read_bytes()) for f in env.files if f.version is not None}
        record_path = env.state_dir / RECORD_NAME
        record = OverlayRecord.load(record_path) if record_path.exists() else None
        try:
            line: pins.Line | None = pins.get_line(wheels.split_local(env.version)[0])
        except KeyError:
            line = None
        if record is None and any(wheels.is_patched(f.version) for f in env.files):
            return self._wheel_status(env, line, current)
        if record is not None:
            changed = [f.file for f in record.files if current.get(f.file) != f.overlay_sha256]
            if record.state == OverlayState.INSTALLING.value:
                return Status(OverlayState.INSTALLING, env, line, record, current)
            if not changed:
                return Status(OverlayState.INSTALLED, env, line, record, current)
            if all(current.get(f.file) == f.original_sha256 for f in record.files):
                return Status(OverlayState.REVERTED, env, line, record, current)
            why = ", ".join(
                f"{f.target} changed since (sha256 {current.get(f.file, '-')[:12]}, "
                f"installed {f.overlay_sha256[:12]})"
                for f in record.files
                if f.file in changed
            )
            return Status(OverlayState.MODIFIED, env, line, record, current, why)
        if line is None or env.version == line.name:
            why = f"{env.target}: {unpinned_refusal(env.version, current[pins.EXECUTOR.name], env=env)}"
            return Status(OverlayState.UNPINNED, env, line, None, current, why)
        members = self._members(env, line)
        for inst, pin in members:
            if pin is None:
                why = f"{inst.target}: {sdk_refusal(line, env, inst.version)}"
                return Status(OverlayState.UNPINNED, env, line, None, current, why)
        for inst, pin in members:
            assert pin is not None  # refused just above
            if current.get(inst.file.name) != pin.source_sha256:
                why = (
                    f"{inst.target} is not byte-identical to the pinned {inst.file.distribution} "
                    f"{pin.version} base (sha256 {current.get(inst.file.name, '-')[:12]}, "
                    f"expected {pin.source_sha256[:12]})"
                )
                return Status(OverlayState.FOREIGN, env, line, None, current, why)
        return Status(OverlayState.PRISTINE, env, line, None, current)

    def _wheel_status(self, env: Environment, line: pins.Line | None, current: dict[str, str]) -> Status:
        """WHEEL when every file a patched wheel recorded is installed as it recorded, else MODIFIED."""
        said, changed = [], []
        seen: set[str] = set()
        for inst in env.files:
            # why: a distribution shipping several of the series' files is one wheel, one record
            if inst.version is None or inst.file.distribution in seen:
                continue
            seen.add(inst.file.distribution)
            if not wheels.is_patched(inst.version):
                said.append(f"{inst.file.distribution} {inst.version} as published (unpatched)")
                continue
            rec = inst.wheel_record or {}
            files = rec.get("files", [])
            for entry in files:
                path = inst.site / entry["path"]
                got = sha256(path.read_bytes()) if path.is_file() else "missing"
                if got != entry["sha256_after"]:
                    changed.append(
                        f"{path} (sha256 {got[:12]}, the wheel installed {entry['sha256_after'][:12]})"
                    )
            patches = len(rec.get("series", {}).get("patches", []))
            said.append(
                f"{inst.file.distribution} {inst.version} ({len(files)} file(s), {patches} patch(es))"
            )
        if not any(inst.wheel_record for inst in env.files):
            why = "a +lepatch version without its lepatch.json record (not built by `nox -s wheels`?)"
            return Status(OverlayState.FOREIGN, env, line, None, current, why)
        if changed:
            why = "a patched wheel's file changed since it was installed: " + ", ".join(changed)
            return Status(OverlayState.MODIFIED, env, line, None, current, why)
        return Status(OverlayState.WHEEL, env, line, None, current, "; ".join(said) + "; unchanged since")

    # ---------------------------------------------------------------- install

    def install(self) -> Status:
        env = self.inspect()
        st = self.status(env)
        if st.state is OverlayState.WHEEL or (st.record is None and st.state is OverlayState.MODIFIED):
            raise OverlayError(
                f"{env.prefix}: {st.describe()}; the patched wheels carry the series already "
                "(docs/package.md says how to go back to PyPI's build); refusing, nothing changed"
            )
        if st.state is OverlayState.UNPINNED or st.line is None:
            raise OverlayError(st.why)
        line = st.line
        overlay_file = self.overlay_path(line)
        if not overlay_file.is_file():
            raise OverlayError(
                f"{overlay_file}: no overlay for line {line.name}; run `nox -s apply -- --write` first"
            )
        members = self._members(env, line)
        if self.only is not None and st.record is not None:
            # why: a record describes one install; a partial one on top would lose the other's backup
            raise OverlayError(
                f"{env.state_dir / RECORD_NAME}: overlay {st.record.line} is installed; "
                "run `restore` first, or install without --only; nothing changed"
            )
        sources = {inst.file.name: self.overlay_path(line, inst.file, inst.version) for inst, _ in members}
        overlays = {name: path.read_bytes() for name, path in sources.items()}
        if (
            st.state is OverlayState.INSTALLED
            and st.record
            and {f.file: f.overlay_sha256 for f in st.record.files}
            == {n: sha256(d) for n, d in overlays.items()}
        ):
            self.say(f"overlay {line.name} already installed in {env.prefix}; nothing to do")
            return st
        if st.state is OverlayState.FOREIGN:
            raise OverlayError(f"{st.why}: someone patched it already; refusing, nothing changed")
        if st.state in (OverlayState.MODIFIED, OverlayState.INSTALLING, OverlayState.REVERTED):
            fix = (
                "restore --force` (it keeps the edited files)"
                if st.state is OverlayState.MODIFIED
                else "restore`"
            )
            raise OverlayError(
                f"{env.prefix}: {st.describe()}; run `{fix}, then install again; nothing changed"
            )
        originals: dict[str, bytes] = {}
        for inst, pin in members:
            assert pin is not None  # status() refused an unverified release
            backup = env.state_dir / inst.backup_name
            if st.state is OverlayState.INSTALLED and backup.is_file():
                # A newer overlay than the installed one: the original is already backed up.
                originals[inst.file.name] = backup.read_bytes()
                if sha256(originals[inst.file.name]) != pin.source_sha256:
                    raise OverlayError(f"{backup}: backup does not match the pinned base; restore by hand")
            else:
                originals[inst.file.name] = inst.target.read_bytes()
                if sha256(originals[inst.file.name]) != pin.source_sha256:
                    raise OverlayError(
                        f"{inst.target} is not byte-identical to the pinned {inst.file.distribution} "
                        f"{pin.version} base; refusing, nothing changed"
                    )
        if st.state is OverlayState.INSTALLED:
            self.say(f"upgrading overlay {line.name} in {env.prefix}")
        record = OverlayRecord(
            state=OverlayState.INSTALLING.value,
            line=line.name,
            version=env.version,
            python=str(self.python),
            installed_at=_now(),
            files=[
                FileRecord(
                    file=inst.file.name,
                    distribution=inst.file.distribution,
                    version=inst.version or "",
                    target=str(inst.target),
                    backup=str(env.state_dir / inst.backup_name),
                    original_sha256=sha256(originals[inst.file.name]),
                    overlay_sha256=sha256(overlays[inst.file.name]),
                    overlay_source=str(sources[inst.file.name]),
                )
                for inst, _ in members
            ],
        )
        try:
            env.state_dir.mkdir(parents=True, exist_ok=True)
            for inst, _ in members:
                backup = env.state_dir / inst.backup_name
                if not backup.exists():
                    _write_atomically(backup, originals[inst.file.name])
            record.save(env.state_dir / RECORD_NAME)
            for inst, _ in members:
                _write_atomically(inst.target, overlays[inst.file.name], mode_from=inst.target)
                drop_bytecode(inst.target)
        except OSError as exc:
            self._put_back(env, record)
            raise OverlayError(
                f"{env.prefix}: cannot install the overlay ({exc}); originals left in place"
            ) from exc

        ok, detail = self.smoke(env, [inst.file for inst, _ in members])
        if not ok:
            self._put_back(env, record)
            raise OverlayError(
                f"{members[0][0].target}: overlay {line.name} failed the smoke dispatch ({detail}); "
                "the original files were put back"
            )
        record.state = OverlayState.INSTALLED.value
        record.save(env.state_dir / RECORD_NAME)
        installed = ", ".join(f"{f.target} (sha256 {f.overlay_sha256[:12]})" for f in record.files)
        self.say(
            f"installed overlay {line.name}: {installed}; originals backed up in {env.state_dir}; "
            "smoke dispatch passed"
        )
        return self.status(env)

    def smoke(
        self, env: Environment, files: Sequence[pins.UpstreamFile] = (pins.EXECUTOR,)
    ) -> tuple[bool, str]:
        """Compile the new files, then run the harness's no-database dispatch in the target env (the
        executor's check), or import task-sdk's supervisor there when it is installed alone."""
        targets = [inst.target for inst in env.files if inst.file in files]
        compile_ = subprocess.run(
            [
                str(self.python),
                "-I",
                "-c",
                "import py_compile,sys; [py_compile.compile(f, doraise=True) for f in sys.argv[1:]]",
                *map(str, targets),
            ],
            capture_output=True,
            text=True,
        )
        if compile_.returncode != 0:
            return False, "does not compile: " + (compile_.stderr.strip().splitlines() or ["?"])[-1]
        if pins.EXECUTOR in files:
            if not self.smoke_script.is_file():
                return False, f"smoke script {self.smoke_script} is missing"
            command = [str(self.python), str(self.smoke_script), "--smoke"]
        else:
            modules = ", ".join(f.package_path.removesuffix(".py").replace("/", ".") for f in files)
            command = [str(self.python), "-I", "-c", f"import {modules}"]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        with tempfile.TemporaryDirectory(prefix="lepatch-overlay-smoke-") as home:
            environ["AIRFLOW_HOME"] = home
            environ["AIRFLOW__API_AUTH__JWT_SECRET"] = "lepatch-smoke-not-a-secret"
            proc = subprocess.Popen(
                command,
                cwd=home,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                output, _ = proc.communicate(timeout=self.smoke_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return False, f"no result within {self.smoke_timeout:.0f}s"
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # workers it left behind
        if proc.returncode != 0:
            lines = output.decode(errors="replace").strip().splitlines() or ["no output"]
            return False, f"exit {proc.returncode}: {lines[-1][:200]}"
        return True, "passed"

    def _put_back(self, env: Environment, record: OverlayRecord) -> None:
        """Every recorded file back from its backup (or as read before the swap), the state dir gone."""
        for f in record.files:
            backup = Path(f.backup)
            if backup.is_file() and sha256(backup.read_bytes()) == f.original_sha256:
                target = Path(f.target)
                if not target.is_file() or sha256(target.read_bytes()) != f.original_sha256:
                    _write_atomically(target, backup.read_bytes(), mode_from=target)
                drop_bytecode(target)
        for f in record.files:
            Path(f.backup).unlink(missing_ok=True)
        (env.state_dir / RECORD_NAME).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            env.state_dir.rmdir()

    # ---------------------------------------------------------------- restore

    def restore(self, *, force: bool = False) -> Status:
        env = self.inspect()
        st = self.status(env)
        rec = st.record
        if rec is None:
            raise OverlayError(f"{env.state_dir / RECORD_NAME}: no overlay record; nothing to restore")
        have = {str(f.target) for f in env.files}
        for f in rec.files:
            if f.target not in have:
                raise OverlayError(
                    f"{env.state_dir / RECORD_NAME}: records {f.target}, which this env does not have"
                )
            backup = Path(f.backup)
            if not backup.is_file() or sha256(backup.read_bytes()) != f.original_sha256:
                raise OverlayError(f"{backup}: backup missing or not the recorded original; nothing changed")
        if st.state is OverlayState.MODIFIED and not force:
            raise OverlayError(
                f"{st.why}; `restore --force` puts the originals back and keeps the edited files; "
                "nothing changed"
            )
        kept: list[Path] = []
        if st.state is OverlayState.MODIFIED:
            for f in rec.files:
                current = st.current.get(f.file, "")
                if current not in (f.overlay_sha256, f.original_sha256):
                    copy = (
                        env.state_dir / KEPT_DIR_NAME / f"{f.file}.{_now().replace(':', '')}.{current[:12]}"
                    )
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f.target, copy)
                    kept.append(copy)
        for f in rec.files:
            _write_atomically(Path(f.target), Path(f.backup).read_bytes(), mode_from=Path(f.target))
        self._put_back(env, rec)
        restored = ", ".join(f"{f.target} (sha256 {f.original_sha256[:12]})" for f in rec.files)
        self.say(
            f"restored the originals: {restored}; overlay {rec.line} removed"
            + "".join(f"; the edited {p.name.split('.py.')[0]}.py is kept as {p}" for p in kept)
        )
        return self.status(env)


# -------------------------------------------------------------------- CLI


# ``--only``: one upstream file alone, by the host that runs it.
ONLY = {"executor": pins.EXECUTOR, "supervisor": pins.SUPERVISOR, "api-server": pins.AUTH_MANAGER}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("install", "status", "restore"))
    parser.add_argument("--python", required=True, type=Path, help="the Airflow environment's interpreter")
    parser.add_argument("--overlay-dir", type=Path, default=OVERLAY_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--force", action="store_true", help="restore even if the file changed since install")
    parser.add_argument("--json", action="store_true", help="status: print the state and record as JSON")
    parser.add_argument(
        "--only",
        choices=tuple(ONLY),
        help="install: this file alone (supervisor: any executor's worker host, e.g. Celery's; "
        "api-server: the host of the API server, whatever the executor)",
    )


def run(args: argparse.Namespace) -> int:
    only = ONLY.get(args.only or "")
    installer = OverlayInstaller(args.python, overlay_dir=args.overlay_dir, only=only)
    try:
        if args.action == "install":
            installer.install()
            return 0
        if args.action == "restore":
            installer.restore(force=args.force)
            return 0
        st = installer.status()
    except OverlayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "state": st.state.value,
                    "target": str(st.env.target),
                    "version": st.env.version,
                    "sha256": st.current_sha256,
                    "files": {
                        f.file.name: {"version": f.version, "target": str(f.target)} for f in st.env.files
                    },
                    "current_sha256": st.current,
                    "record": asdict(st.record) if st.record else None,
                },
                indent=2,
            )
        )
    else:
        print(st.describe())
    return 0 if st.state.healthy else 3


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("overlay", help="install, inspect or restore the overlay in an Airflow environment")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools overlay", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""Install the patched ``local_executor.py`` into an operator's Airflow environment, reversibly.

The overlay for a release line (``airflow_overlay/<line>/airflow/executors/local_executor.py``)
replaces the installed file only when the environment is exactly what the overlay was
verified for: an apache-airflow-core version that is pinned (a line's version or one it
``covers``) and a ``local_executor.py`` byte-identical to the pinned base. Everything the
install did is written down in a state directory inside the environment::

    <sys.prefix of the env>/lepatch-overlay/
        record.json                 what was installed where, and the hashes on both sides
        local_executor.py.orig      the original file, byte for byte
        kept/                       files ``restore --force`` replaced (an operator's edit), kept

so ``restore`` can put the original back exactly and ``status`` can tell whether the file
was changed since. The record's ``state`` is written *before* the file is swapped
(``installing``) and flipped to ``installed`` after the smoke dispatch passed: an install
that was killed half-way is visible, and ``restore`` undoes it.

Inspecting the environment never imports Airflow: the version and the file's location come
from the distribution's metadata (``python -I``, so PYTHONPATH cannot point elsewhere).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from tools import pins, releases
from tools.errors import ToolError
from tools.layout import DEFAULT as LAYOUT

OVERLAY_DIR = LAYOUT.overlay
SMOKE_SCRIPT = LAYOUT.tests_executor / "harness.py"
STATE_DIR_NAME = "lepatch-overlay"
RECORD_NAME = "record.json"
BACKUP_NAME = "local_executor.py.orig"
KEPT_DIR_NAME = "kept"  # why: restore --force must not lose an operator's edit of the file
SMOKE_TIMEOUT = 180.0

# Runs inside the target environment: where is apache-airflow-core and which version is it.
_INSPECT = """
import importlib.metadata as md, json, sys
out = {"prefix": sys.prefix, "version": None, "file": None}
try:
    dist = md.distribution(%(dist)r)
except md.PackageNotFoundError:
    pass
else:
    out["version"] = dist.version
    out["file"] = str(dist.locate_file(%(path)r))
print(json.dumps(out))
"""


class OverlayError(ToolError):
    """A refusal or failure; the message is one line naming the path at fault."""


class OverlayState(enum.Enum):
    """What ``status`` finds; the record's ``state`` field holds INSTALLING or INSTALLED."""

    PRISTINE = "pristine"  # no record, the file is the pinned base
    INSTALLING = "installing"  # an install was interrupted between swap and smoke result
    INSTALLED = "installed"  # the recorded overlay is in place, unchanged
    MODIFIED = "modified"  # the recorded overlay was installed, the file changed since
    REVERTED = "reverted"  # a record exists but the file is the base again (package reinstalled?)
    FOREIGN = "foreign"  # no record and the file is not the pinned base: patched by someone else
    UNPINNED = "unpinned"  # the installed version is not one the overlays were verified for

    @property
    def healthy(self) -> bool:
        return self in (OverlayState.PRISTINE, OverlayState.INSTALLED)


@dataclass
class Environment:
    python: Path
    prefix: Path
    version: str
    target: Path  # the installed local_executor.py

    @property
    def state_dir(self) -> Path:
        return self.prefix / STATE_DIR_NAME


@dataclass
class OverlayRecord:
    state: str  # OverlayState.INSTALLING.value or OverlayState.INSTALLED.value
    line: str
    version: str
    python: str
    target: str
    backup: str
    original_sha256: str
    overlay_sha256: str
    overlay_source: str
    installed_at: str
    schema: int = 1

    @classmethod
    def load(cls, path: Path) -> OverlayRecord:
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise OverlayError(f"{path}: unreadable overlay record ({exc}); inspect it by hand") from exc

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


@dataclass
class Status:
    state: OverlayState
    env: Environment
    line: pins.Line | None
    record: OverlayRecord | None
    current_sha256: str

    def describe(self) -> str:
        where = f"{self.env.target} (apache-airflow-core {self.env.version})"
        rec = self.record
        if self.state is OverlayState.PRISTINE:
            return f"none: {where} is the pinned {self.line.name if self.line else '?'} base"
        if self.state is OverlayState.INSTALLED and rec:
            return f"overlay {rec.line} installed {rec.installed_at} in {where}; unchanged since"
        if self.state is OverlayState.MODIFIED and rec:
            return (
                f"overlay {rec.line} installed {rec.installed_at} in {where}, but the file changed since "
                f"(sha256 {self.current_sha256[:12]}, installed {rec.overlay_sha256[:12]})"
            )
        if self.state is OverlayState.INSTALLING and rec:
            return f"an install of overlay {rec.line} into {where} was interrupted: run restore"
        if self.state is OverlayState.REVERTED:
            return (
                f"none: {where} is the pinned base again, but a stale record is left in {self.env.state_dir}"
            )
        if self.state is OverlayState.FOREIGN:
            return f"unknown: {where} is not the pinned base and no overlay record exists (patched by hand?)"
        return f"unsupported: {where}: {unpinned_refusal(self.env.version, self.current_sha256)}"


def unpinned_refusal(version: str, current_sha256: str, lines: Sequence[pins.Line] = pins.LINES) -> str:
    """Why ``version`` gets no overlay, and the release to move to, in one sentence.

    An overlay is verified against one ``local_executor.py`` and the release it came in; a
    release with another file (3.1.0-3.1.3 on the 3.1 line) would need a base of its own and
    the series applied and verified there, so it is refused with the nearest verified
    release named, the smallest upgrade that is served.
    """
    refusing = "refusing, nothing changed"
    if not releases.is_release(version):
        return f"{pins.DISTRIBUTION} {version} is not a release any overlay is verified for; {refusing}"
    line = next((ln for ln in lines if ln.name == releases.line_of(version)), None)
    nearest = releases.nearest_verified(version, lines)
    if line is not None and releases.version_key(version) > releases.version_key(line.version):
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
        newest = max((ln.version for ln in lines), key=releases.version_key)
        return (
            f"{pins.DISTRIBUTION} {version} is newer than every pinned line (newest: {newest}); "
            f"no overlay is verified for it; {refusing}"
        )
    to_line, to_version = nearest
    verified = ", ".join(releases.verified_versions(to_line))
    way = (
        f"upgrade to {to_version}, the nearest verified release "
        f"({'same line' if line is to_line else f'the {to_line.name} line'}; verified: {verified}), "
        f"then install again; {refusing}"
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
    ) -> None:
        self.python = Path(python)
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
        script = _INSPECT % {"dist": pins.DISTRIBUTION, "path": pins.PACKAGE_PATH}
        try:
            proc = subprocess.run(
                [str(self.python), "-I", "-c", script], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise OverlayError(f"{self.python}: cannot run it to inspect the environment ({exc})") from exc
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise OverlayError(f"{self.python}: inspecting the environment failed: {last}")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        if not data["version"]:
            raise OverlayError(f"{self.python}: {pins.DISTRIBUTION} is not installed in {data['prefix']}")
        target = Path(data["file"]).resolve()
        if not target.is_file():
            raise OverlayError(
                f"{target}: {pins.DISTRIBUTION} {data['version']} is installed but this file is missing"
            )
        return Environment(self.python, Path(data["prefix"]), data["version"], target)

    def overlay_path(self, line: pins.Line) -> Path:
        return self.overlay_dir / line.name / pins.PACKAGE_PATH

    def status(self, env: Environment | None = None) -> Status:
        env = env or self.inspect()
        current = sha256(env.target.read_bytes())
        record_path = env.state_dir / RECORD_NAME
        record = OverlayRecord.load(record_path) if record_path.exists() else None
        try:
            line: pins.Line | None = pins.get_line(env.version)
        except KeyError:
            line = None
        if record is not None:
            if record.state == OverlayState.INSTALLING.value:
                state = OverlayState.INSTALLING
            elif current == record.overlay_sha256:
                state = OverlayState.INSTALLED
            elif current == record.original_sha256:
                state = OverlayState.REVERTED
            else:
                state = OverlayState.MODIFIED
        elif line is None or env.version == line.name:
            state = OverlayState.UNPINNED
        elif current == line.source_sha256:
            state = OverlayState.PRISTINE
        else:
            state = OverlayState.FOREIGN
        return Status(state, env, line, record, current)

    # ---------------------------------------------------------------- install

    def install(self) -> Status:
        env = self.inspect()
        st = self.status(env)
        if st.state is OverlayState.UNPINNED or st.line is None:
            raise OverlayError(f"{env.target}: {unpinned_refusal(env.version, st.current_sha256)}")
        line = st.line
        overlay_file = self.overlay_path(line)
        if not overlay_file.is_file():
            raise OverlayError(
                f"{overlay_file}: no overlay for line {line.name}; run `nox -s apply -- --write` first"
            )
        overlay = overlay_file.read_bytes()
        overlay_sha = sha256(overlay)
        if st.state is OverlayState.INSTALLED and st.record and st.record.overlay_sha256 == overlay_sha:
            self.say(f"overlay {line.name} already installed in {env.target}; nothing to do")
            return st
        if st.state is OverlayState.FOREIGN:
            raise OverlayError(
                f"{env.target}: not byte-identical to the pinned {line.version} base "
                f"(sha256 {st.current_sha256[:12]}, expected {line.source_sha256[:12]}): "
                "someone patched it already; refusing, nothing changed"
            )
        if st.state is OverlayState.MODIFIED and st.record:
            raise OverlayError(
                f"{env.target}: changed since overlay {st.record.line} was installed "
                f"(sha256 {st.current_sha256[:12]}); run `restore --force` (it keeps the changed file in "
                f"{env.state_dir / KEPT_DIR_NAME}), then install again; nothing changed"
            )
        if st.state in (OverlayState.INSTALLING, OverlayState.REVERTED) and st.record:
            what = (
                f"an install of overlay {st.record.line} was interrupted"
                if st.state is OverlayState.INSTALLING
                else f"the pinned base again, but the record of overlay {st.record.line} is left in "
                f"{env.state_dir}"
            )
            raise OverlayError(f"{env.target}: {what}; run `restore`, then install again; nothing changed")

        backup = env.state_dir / BACKUP_NAME
        if st.state is OverlayState.INSTALLED and st.record:
            # A newer overlay than the installed one: the original is already backed up.
            original = backup.read_bytes()
            if sha256(original) != line.source_sha256:
                raise OverlayError(f"{backup}: backup does not match the pinned base; restore by hand")
            self.say(
                f"upgrading overlay {line.name} in {env.target} "
                f"({st.record.overlay_sha256[:12]} -> {overlay_sha[:12]})"
            )
        else:
            original = env.target.read_bytes()
        record = OverlayRecord(
            state=OverlayState.INSTALLING.value,
            line=line.name,
            version=env.version,
            python=str(self.python),
            target=str(env.target),
            backup=str(backup),
            original_sha256=sha256(original),
            overlay_sha256=overlay_sha,
            overlay_source=str(overlay_file),
            installed_at=_now(),
        )
        try:
            env.state_dir.mkdir(parents=True, exist_ok=True)
            if not backup.exists():
                _write_atomically(backup, original)
            record.save(env.state_dir / RECORD_NAME)
            _write_atomically(env.target, overlay, mode_from=env.target)
            drop_bytecode(env.target)
        except OSError as exc:
            self._put_back(env, original)
            raise OverlayError(
                f"{env.target}: cannot install the overlay ({exc}); original left in place"
            ) from exc

        ok, detail = self.smoke(env)
        if not ok:
            self._put_back(env, original)
            raise OverlayError(
                f"{env.target}: overlay {line.name} failed the smoke dispatch ({detail}); "
                "the original file was put back"
            )
        record.state = OverlayState.INSTALLED.value
        record.save(env.state_dir / RECORD_NAME)
        self.say(
            f"installed overlay {line.name} (sha256 {overlay_sha[:12]}) into {env.target}; "
            f"original backed up to {backup}; smoke dispatch passed"
        )
        return self.status(env)

    def smoke(self, env: Environment) -> tuple[bool, str]:
        """Compile the new file, then run the harness's no-database dispatch in the target env."""
        compile_ = subprocess.run(
            [
                str(self.python),
                "-I",
                "-c",
                "import py_compile,sys; py_compile.compile(sys.argv[1], doraise=True)",
                str(env.target),
            ],
            capture_output=True,
            text=True,
        )
        if compile_.returncode != 0:
            return False, "does not compile: " + (compile_.stderr.strip().splitlines() or ["?"])[-1]
        if not self.smoke_script.is_file():
            return False, f"smoke script {self.smoke_script} is missing"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        with tempfile.TemporaryDirectory(prefix="lepatch-overlay-smoke-") as home:
            environ["AIRFLOW_HOME"] = home
            environ["AIRFLOW__API_AUTH__JWT_SECRET"] = "lepatch-smoke-not-a-secret"
            proc = subprocess.Popen(
                [str(self.python), str(self.smoke_script), "--smoke"],
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

    def _put_back(self, env: Environment, original: bytes) -> None:
        _write_atomically(env.target, original, mode_from=env.target)
        drop_bytecode(env.target)
        for name in (RECORD_NAME, BACKUP_NAME):
            (env.state_dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            env.state_dir.rmdir()

    # ---------------------------------------------------------------- restore

    def restore(self, *, force: bool = False) -> Status:
        env = self.inspect()
        st = self.status(env)
        rec = st.record
        if rec is None:
            raise OverlayError(f"{env.state_dir / RECORD_NAME}: no overlay record; nothing to restore")
        if Path(rec.target) != env.target:
            raise OverlayError(
                f"{env.state_dir / RECORD_NAME}: records {rec.target}, but this env has {env.target}"
            )
        backup = Path(rec.backup)
        original = backup.read_bytes() if backup.is_file() else b""
        if sha256(original) != rec.original_sha256:
            raise OverlayError(f"{backup}: backup missing or not the recorded original; nothing changed")
        kept_dir = env.state_dir / KEPT_DIR_NAME
        if st.state is OverlayState.MODIFIED and not force:
            raise OverlayError(
                f"{env.target}: changed since the overlay was installed (sha256 {st.current_sha256[:12]}); "
                f"`restore --force` puts the original back and keeps the changed file in {kept_dir}; "
                "nothing changed"
            )
        kept = None
        if st.current_sha256 not in (rec.original_sha256, rec.overlay_sha256):
            # An edit of the installed file (MODIFIED, or an interrupted install): never lost.
            stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            kept = kept_dir / f"{env.target.name}.{stamp}.{st.current_sha256[:12]}"
            kept_dir.mkdir(parents=True, exist_ok=True)
            _write_atomically(kept, env.target.read_bytes())
        self._put_back(env, original)
        self.say(
            f"restored the original {env.target} (sha256 {rec.original_sha256[:12]}); "
            f"overlay {rec.line} removed" + (f"; the changed file is kept as {kept}" if kept else "")
        )
        return self.status(env)


# -------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("install", "status", "restore"))
    parser.add_argument("--python", required=True, type=Path, help="the Airflow environment's interpreter")
    parser.add_argument("--overlay-dir", type=Path, default=OVERLAY_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--force", action="store_true", help="restore even if the file changed since install")
    parser.add_argument("--json", action="store_true", help="status: print the state and record as JSON")


def run(args: argparse.Namespace) -> int:
    installer = OverlayInstaller(args.python, overlay_dir=args.overlay_dir)
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

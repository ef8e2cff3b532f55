"""The Airflow environment the e2e session runs: one venv per release line, and the executor in it.

``build/e2e/venv-<line>`` holds ``apache-airflow[postgres]`` pinned to the line's version (the
distribution, so the task SDK and the standard provider come with it) and the line's verified
``apache-airflow-core`` wheel from the cache, constrained by ``constraints/e2e-<line>.txt`` (the
release day's dependencies, :mod:`tools.measure.e2e.lock`) or else the line's test lock. It is created
with ``uv`` on first use and reused while its marker says it was built for the same inputs.

The executor under test is then put in place, with task-sdk's ``supervisor.py`` of the same stage
(or of the stage ``--supervisor`` names):

- stage 0: the pinned bases, byte for byte (``tools.engine.fetch.read_bases``);
- stage k: the files of ``tools.engine.apply`` stage k, copied in;
- default (the full series): the line's overlay ``airflow_overlay/<line>/...``, installed with
  ``tools.delivery.overlay_install`` (backup, record, smoke dispatch), or copied in when that installer or
  its smoke harness is not there, or when the supervisor comes from another stage.

Whatever was installed before is undone first, so the venv always starts from the pinned bases,
and each installed file's sha256 is checked against the intended source afterwards.

``--executor package`` installs the line's wheel (:mod:`tools.delivery.package`, built from the overlay into
``<out>/dist``) into the venv with pinned bases instead, as an operator would (``uv pip install``
of the wheel; the stack sets ``AIRFLOW__CORE__EXECUTOR`` to its class), and checks that Airflow's own
files are still the bases byte for byte. Undoing it is ``uv pip uninstall``.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools.delivery import overlay_install, package
from tools.delivery.overlay_install import OverlayError, OverlayInstaller, OverlayState
from tools.engine import apply, fetch, venvs
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT

MARKER = ".lepatch-e2e.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ExecutorSource:
    label: str  # "stage 0 (base 3.3.2)", "stage 2 of 3.3", "full series (airflow_overlay/3.3)"
    stage: int | None  # None: the full series overlay
    data: bytes  # local_executor.py
    origin: str  # where the bytes came from
    # Every upstream file to install, by installed path (local_executor.py's is ``data``).
    sources: dict[str, bytes] = field(default_factory=dict)
    mixed: bool = False  # the supervisor comes from another stage than the executor

    @property
    def sha256(self) -> str:
        return sha256(self.data)


def base_python() -> str:
    """The interpreter to build the venv from: the one running us (uv cannot download one here)."""
    return sys.executable


def series_length() -> int | None:
    series = LAYOUT.series_file
    if not series.is_file():
        return None
    return sum(1 for ln in series.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


def stage_sources(line: pins.Line, stage: int | None) -> tuple[dict[str, bytes], str, str]:
    """Every upstream file of a stage of ``line`` by installed path, its label and origin."""
    if stage == 0:
        bases = fetch.read_bases(line)
        files = {f.package_path: bases[f.repo_path] for f in pins.UPSTREAM_FILES if f.repo_path in bases}
        return files, f"stage 0 (base {line.version})", "pinned wheel"
    if stage is None:
        overlay = LAYOUT.overlay / line.name / pins.PACKAGE_PATH
        if not overlay.is_file():
            raise ToolError(
                f"{LAYOUT.rel(overlay)}: no overlay for line {line.name} yet; "
                "run `nox -s apply -- --write`, or pass --stage 0 for the unpatched base"
            )
        files = LAYOUT.overlay_files(line.name)
        n = series_length()
        what = f"{n} patches" if n is not None else "the series"
        where = LAYOUT.rel(LAYOUT.overlay / line.name)
        return files, f"full series ({what}, {where})", where
    return (
        apply.apply_line(line).sources(stage),
        f"stage {stage} of {line.name}",
        f"python -m tools stage --stage {stage}",
    )


def resolve_source(line: pins.Line, stage: int | None, supervisor: int | str | None = "") -> ExecutorSource:
    """The files of the requested stage of ``line``; task-sdk's from ``supervisor``'s stage if given."""
    files, label, origin = stage_sources(line, stage)
    source = ExecutorSource(label, stage, files[pins.PACKAGE_PATH], origin, files)
    if supervisor == "" or supervisor == stage:
        return source
    assert not isinstance(supervisor, str)
    other, other_label, _ = stage_sources(line, supervisor)
    path = pins.SUPERVISOR.package_path
    return replace(
        source,
        label=f"{label}, supervisor.py of {other_label}",
        sources={**files, path: other[path]},
        mixed=True,
    )


class AirflowVenv:
    """``build/e2e/venv-<line>``; with ``celery``, ``venv-celery-<line>``: ``apache-airflow[celery]``
    (the provider, celery, billiard, redis) pinned by ``constraints/e2e-celery-<line>.txt``."""

    def __init__(self, line: pins.Line, root: Path, say: Callable[[str], None], celery: bool = False):
        self.line = line
        self.celery = celery
        self.path = root / (f"venv-celery-{line.name}" if celery else f"venv-{line.name}")
        self.say = say

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def executor_file(self) -> Path:
        return venvs.purelib(self.python) / pins.PACKAGE_PATH

    def _marker(self) -> object:
        try:
            return json.loads((self.path / MARKER).read_text())
        except (OSError, ValueError):
            return None

    def ensure(self) -> None:
        """Create (or reuse) the venv with the line's pinned Airflow, constrained by the line's lock."""
        wheel = fetch.ensure_wheel(self.line)
        # why: the line's test lock floats to today's dependencies, which an older Airflow may not
        # start with; the e2e lock (python -m tools e2e-lock) is the release day's environment.
        constraints = LAYOUT.constraints / f"e2e-{self.line.name}.txt"
        extras = "postgres"
        if self.celery:
            # why: the provider must be a release that resolves with the line; the lock pins one.
            constraints = LAYOUT.constraints / f"e2e-celery-{self.line.name}.txt"
            extras = "postgres,celery"
            if not constraints.is_file():
                raise ToolError(
                    f"{LAYOUT.rel(constraints)} is missing: run `python -m tools e2e-lock --celery "
                    f"--line {self.line.name}` first"
                )
        if not constraints.is_file():
            constraints = LAYOUT.constraints / f"{self.line.name}.txt"
        packages = [f"apache-airflow[{extras}]=={self.line.version}"]
        want = {
            "line": self.line.name,
            "version": self.line.version,
            "wheel_sha256": self.line.wheel_sha256,
            "constraints_sha256": sha256(constraints.read_bytes()) if constraints.is_file() else None,
            "python": venvs._python_identity(base_python()),
            "packages": packages,
        }
        if self.python.exists() and self._marker() == want:
            return
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.say(f"creating {LAYOUT.rel(self.path)}: {packages[0]} (uv)")
        venvs.run_uv("venv", "--quiet", "-p", base_python(), str(self.path))
        pin = ["-c", str(constraints)] if constraints.is_file() else []
        venvs.run_uv(
            "pip",
            "install",
            "--quiet",
            "--python",
            str(self.python),
            *pin,
            str(wheel),
            *packages,
            env={"UV_COMPILE_BYTECODE": "1"},
        )
        (self.path / MARKER).write_text(json.dumps(want, indent=2) + "\n")

    def install_executor(self, source: ExecutorSource) -> str:
        """Put ``source``'s files in place of the venv's; returns how they were installed."""
        bases = self._back_to_base()
        if source.stage is None and not source.mixed and Path(overlay_install.SMOKE_SCRIPT).is_file():
            said = io.StringIO()
            try:
                OverlayInstaller(self.python, out=said).install()
            except OverlayError as e:
                raise ToolError(f"overlay install into {LAYOUT.rel(self.path)} failed: {e}") from e
            finally:
                for ln in said.getvalue().splitlines():
                    self.say(f"  {ln}")
            how = "tools.delivery.overlay_install"
        elif source.sources == bases:
            how = "pinned bases (unchanged)"
        else:
            venvs.install_sources(self.python, source.sources)
            how = "copied (stale pyc removed)"
        root = venvs.purelib(self.python)
        for path, data in source.sources.items():
            got = sha256((root / path).read_bytes())
            if got != sha256(data):
                raise ToolError(
                    f"{root / path}: sha256 {got[:12]} after install, "
                    f"expected {sha256(data)[:12]} ({source.label})"
                )
        return how

    def install_supervisor(self, fixed: bool) -> ExecutorSource:
        """The pinned bases; with ``fixed``, task-sdk's patched ``supervisor.py`` alone on top, installed
        as an operator does on a Celery worker's host (``overlay install --only supervisor``)."""
        bases = self._back_to_base()
        path = pins.SUPERVISOR.package_path
        if not fixed:
            return ExecutorSource(
                f"task-sdk unpatched (base {self.line.version})",
                0,
                bases[path],
                "pinned wheel",
                {path: bases[path]},
            )
        said = io.StringIO()
        try:
            OverlayInstaller(self.python, out=said, only=pins.SUPERVISOR).install()
        except OverlayError as e:
            raise ToolError(
                f"overlay install --only supervisor into {LAYOUT.rel(self.path)} failed: {e}"
            ) from e
        finally:
            for ln in said.getvalue().splitlines():
                self.say(f"  {ln}")
        want = LAYOUT.overlay_files(self.line.name)[path]
        got = (venvs.purelib(self.python) / path).read_bytes()
        if sha256(got) != sha256(want):
            raise ToolError(f"{path}: sha256 {sha256(got)[:12]} after install, expected {sha256(want)[:12]}")
        return ExecutorSource(
            f"supervisor fix (overlay --only supervisor, {LAYOUT.rel(LAYOUT.overlay / self.line.name)})",
            None,
            want,
            "tools.delivery.overlay_install --only supervisor",
            {path: want},
        )

    def package_installed(self) -> str | None:
        """The version of the series' wheel installed in the venv, if any."""
        out = venvs.run_uv("pip", "list", "--format", "json", "--python", str(self.python))
        found = [d for d in json.loads(out or "[]") if d.get("name") == package.DIST_NAME]
        return str(found[0]["version"]) if found else None

    def install_package(self, dist: Path) -> ExecutorSource:
        """The pinned bases, then the line's wheel built afresh into ``dist`` and pip-installed."""
        bases = self._back_to_base()
        wheel = package.build(self.line, dist)
        venvs.run_uv("pip", "install", "--quiet", "--python", str(self.python), str(wheel))
        self._check_bases(bases, f"after installing {wheel.name}")
        files, _, _ = stage_sources(self.line, 0)
        return ExecutorSource(
            label=f"package {wheel.name} ({package.EXECUTOR_CLASS})",
            stage=None,
            data=wheel.read_bytes(),
            origin=LAYOUT.rel(wheel),
            sources=files,
        )

    def uninstall_package(self) -> None:
        if self.package_installed() is not None:
            venvs.run_uv("pip", "uninstall", "--quiet", "--python", str(self.python), package.DIST_NAME)

    def _check_bases(self, bases: dict[str, bytes], when: str) -> None:
        root = venvs.purelib(self.python)
        for path, data in bases.items():
            if sha256((root / path).read_bytes()) != sha256(data):
                raise ToolError(f"{root / path}: not the pinned base {when}")

    def _back_to_base(self) -> dict[str, bytes]:
        """Undo any earlier install (the package, the overlay installer's restore, a stage copied in)."""
        self.uninstall_package()
        bases, _, _ = stage_sources(self.line, 0)
        installer = OverlayInstaller(self.python, out=io.StringIO())
        st = installer.status()
        if st.record is not None:
            installer.restore(force=st.state is not OverlayState.INSTALLED)
        venvs.install_sources(self.python, bases)  # no-op but for the stale pyc when already the bases
        return bases

"""The Airflow environment the e2e session runs: one venv per release line, and the executor in it.

``build/e2e/venv-<line>`` (``venv-celery-<line>`` with ``apache-airflow[celery]``) holds
``apache-airflow[postgres]`` of the line's version with its verified core and task-sdk wheels
(``venvs.ensure_release``), constrained by ``constraints/e2e-<line>.txt`` (the release day's
dependencies, :mod:`tools.measure.e2e.lock`) or else the line's test lock. ``--core X``, another
core release the line covers, makes ``venv-<line>-core-X`` with X and the task-sdk X requires,
constrained by ``constraints/e2e-X.txt`` (a later release's lock may not resolve or start with it);
its stage 0 is X's own files and the full series carries that task-sdk's own patched supervisor
(``airflow_overlay/<line>/task-sdk-<v>/``).

The executor under test, with task-sdk's ``supervisor.py`` of the same stage (or ``--supervisor``'s):

- stage 0: the pinned bases, byte for byte (``tools.engine.fetch.read_bases``);
- stage k: the files of ``tools.engine.apply`` stage k, copied in (no wheel carries a stage);
- default (the full series): as an operator installs it, the release's core and task-sdk wheels
  rebuilt with the series' files (:mod:`tools.delivery.wheels`, into ``<out>/wheels``) installed
  ``--no-deps`` over the pinned ones; copied in only when the supervisor comes from another stage;
- ``--executor package``: the line's wheel (:mod:`tools.delivery.package`, into ``<out>/dist``)
  installed beside the release's own files, which must stay the bases byte for byte.

Installs go through ``venvs.pip`` (the venv is uv's, without pip). Whatever was installed before is
undone first (the package uninstalled, the pinned wheels reinstalled), so the venv always starts
from the pinned bases, and each installed file's sha256 is checked against the intended source.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools.delivery import install_commands, package, wheels
from tools.engine import apply, fetch, series, venvs
from tools.measure.e2e import lock
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT


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
        return fetch.sha256_bytes(self.data)


def _patches() -> str:
    n = len(series.read_series_names(LAYOUT.series_file))
    return f"{n} patches" if n else "the series"


def stage_sources(
    line: pins.Line, stage: int | None, core: str | None = None
) -> tuple[dict[str, bytes], str, str]:
    """Every upstream file of a stage of ``line`` by installed path, its label and origin; with
    ``core`` (a release the line covers), that release's files: stage 0 and the full series only."""
    core = core or line.version
    if core != line.version:
        return _release_sources(line, stage, core)
    if stage == 0:
        bases = fetch.read_bases(line)
        files = {f.package_path: bases[f.repo_path] for f in pins.UPSTREAM_FILES if f.repo_path in bases}
        return files, f"stage 0 (base {line.version})", "pinned wheel"
    if stage is None:
        files = _overlay_files(line)
        where = LAYOUT.rel(LAYOUT.overlay / line.name)
        return files, f"full series ({_patches()}, {where})", where
    return (
        apply.apply_line(line).sources(stage),
        f"stage {stage} of {line.name}",
        f"python -m tools stage --stage {stage}",
    )


def _overlay_files(line: pins.Line) -> dict[str, bytes]:
    overlay = LAYOUT.overlay / line.name / pins.PACKAGE_PATH
    if not overlay.is_file():
        raise ToolError(
            f"{LAYOUT.rel(overlay)}: no overlay for line {line.name} yet; "
            "run `nox -s apply -- --write`, or pass --stage 0 for the unpatched base"
        )
    return LAYOUT.overlay_files(line.name)


def _release_sources(line: pins.Line, stage: int | None, core: str) -> tuple[dict[str, bytes], str, str]:
    """Stage 0 or the full series of ``line`` on its core release ``core`` with the task-sdk it requires."""
    sdk = line.core_sdk[core]
    sup = pins.SUPERVISOR.package_path
    pin = line.supervisor_pin(sdk)
    if pin is None:
        raise ToolError(f"line {line.name} has no verified supervisor.py for apache-airflow-task-sdk {sdk}")
    if stage == 0:
        executor = fetch.read_source(fetch.ensure_pin(line.pins[0], core))
        if fetch.sha256_bytes(executor) != line.source_sha256:  # covered: the base's file byte for byte
            raise ToolError(f"apache-airflow-core {core}: {pins.PACKAGE_PATH} is not the line's base")
        files = {pins.PACKAGE_PATH: executor, sup: fetch.read_pinned(pin)}
        return files, f"stage 0 (base {core}, task-sdk {sdk})", "pinned wheels"
    if stage is not None:
        raise ToolError(
            f"apache-airflow-core {core}: stage {stage} means nothing there (the series' stages are "
            f"applied to the line's base {line.version}); stage 0 or the full series"
        )
    # why: a file pinned on the base release only is the base's; this release ships its own
    base_only = {f.package_path for f in pins.UPSTREAM_FILES if f.pinned_on_base_only}
    files = {p: data for p, data in _overlay_files(line).items() if p not in base_only}
    where = LAYOUT.overlay / line.name
    if pin != line.pin(pins.SUPERVISOR):  # a task-sdk release with its own patched supervisor.py
        where = where / apply.sdk_release_dir(sdk)
        files[sup] = (where / sup).read_bytes()
    return files, f"full series ({_patches()}, task-sdk {sdk}: {LAYOUT.rel(where)})", LAYOUT.rel(where)


def resolve_source(
    line: pins.Line, stage: int | None, supervisor: int | str | None = "", core: str | None = None
) -> ExecutorSource:
    """The files of the requested stage of ``line`` (on its release ``core``); task-sdk's from
    ``supervisor``'s stage if given."""
    files, label, origin = stage_sources(line, stage, core)
    source = ExecutorSource(label, stage, files[pins.PACKAGE_PATH], origin, files)
    if supervisor == "" or supervisor == stage:
        return source
    assert not isinstance(supervisor, str)
    other, other_label, _ = stage_sources(line, supervisor, core)
    path = pins.SUPERVISOR.package_path
    return replace(
        source,
        label=f"{label}, supervisor.py of {other_label}",
        sources={**files, path: other[path]},
        mixed=True,
    )


class AirflowVenv:
    """``build/e2e/venv-<line>``; with ``celery``, ``venv-celery-<line>``: ``apache-airflow[celery]``
    (the provider, celery, billiard, redis) pinned by ``constraints/e2e-celery-<line>.txt``. With
    ``core``, another release the line covers: ``-core-<core>`` appended, that release installed."""

    def __init__(
        self,
        line: pins.Line,
        root: Path,
        say: Callable[[str], None],
        celery: bool = False,
        core: str | None = None,
    ):
        self.line = line
        self.celery = celery
        self.core = core or line.version
        self.sdk = line.core_sdk.get(self.core, line.sdk_version)
        name = f"venv-celery-{line.name}" if celery else f"venv-{line.name}"
        self.path = root / (name if self.core == line.version else f"{name}-core-{self.core}")
        self.say = say

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def ensure(self) -> None:
        """Create (or reuse) the venv with the release's Airflow, constrained by the line's lock."""
        # why: the line's test lock floats to today's dependencies, which an older Airflow may not
        # start with; the e2e lock (python -m tools e2e-lock) is the release day's environment.
        # Another core release needs its own: the base's lock pins what it may refuse to resolve
        # (3.3.0: aiosqlite) or start with (3.1.6's api-server: pyjwt 2.11.0, `iss` must be a string).
        constraints = lock.constraints_path(self.line, LAYOUT, self.celery, self.core)
        if not constraints.is_file() and (self.celery or self.core != self.line.version):
            command = f"python -m tools e2e-lock{' --celery' if self.celery else ''} --line {self.line.name}"
            if self.core != self.line.version:
                command += f" --core {self.core}"
            raise ToolError(
                f"{LAYOUT.rel(constraints)} is missing: run `{command}` first (the release day's environment)"
            )
        if not constraints.is_file():
            constraints = LAYOUT.constraints / f"{self.line.name}.txt"
        venvs.ensure_release(
            self.path,
            self.core,
            self.sdk,
            packages=[f"apache-airflow[{lock.extras(self.celery)}]=={self.core}"],
            constraints=constraints if constraints.is_file() else None,
            python=sys.executable,  # uv cannot download one here
            say=self.say,
        )

    def sources(self, stage: int | None) -> dict[str, bytes]:
        """The files of ``stage`` (0: the release's own) for this venv's release, by installed path."""
        return stage_sources(self.line, stage, self.core)[0]

    def install_executor(self, source: ExecutorSource) -> str:
        """Put ``source``'s files in place of the venv's; returns how they were installed."""
        if source.stage is None and not source.mixed:
            installed = self.install_wheels(self.path.parent / "wheels")
            if installed.sources != source.sources:
                raise ToolError(
                    f"the patched wheels are not {source.label}: rebuild the overlay (apply --write)"
                )
            return f"uv pip install --no-deps of the patched wheels ({installed.origin})"
        # why copied: a stage before the final one (or a supervisor from another stage) is in no wheel
        bases = self._back_to_base()
        if source.sources == bases:
            how = "pinned bases (unchanged)"
        else:
            venvs.install_sources(self.python, source.sources)
            how = "copied (stale pyc removed)"
        self._check(source.sources, f"after install ({source.label})")
        return how

    def install_supervisor(self, fixed: bool) -> ExecutorSource:
        """The pinned bases; with ``fixed``, the patched wheels, as on a Celery worker's host (task-sdk's
        supervisor is what runs there)."""
        path = pins.SUPERVISOR.package_path
        if not fixed:
            bases = self._back_to_base()
            return ExecutorSource(
                f"task-sdk unpatched (base {self.sdk})",
                0,
                bases[path],
                "pinned wheel",
                {path: bases[path]},
            )
        installed = self.install_wheels(self.path.parent / "wheels")
        want = installed.sources[path]
        return ExecutorSource(
            f"supervisor fix ({installed.label})",
            None,
            want,
            f"the patched wheels ({installed.origin})",
            {path: want},
        )

    def install_package(self, dist: Path) -> ExecutorSource:
        """The release's own files, then the line's wheel built afresh into ``dist`` and pip-installed
        with the venv's core and task-sdk named beside it (as the Dockerfile pins Airflow), so the
        resolver cannot move Airflow to another release to satisfy the wheel."""
        bases = self._back_to_base()
        wheel = package.build(self.line, dist)
        airflow = venvs.release_wheels(self.core, self.sdk)
        venvs.pip(self.python, "install", "--quiet", *map(str, airflow), str(wheel))
        self._check(bases, f"after installing {wheel.name} (the pinned base)")
        return ExecutorSource(
            label=f"package {wheel.name} ({package.EXECUTOR_CLASS})",
            stage=None,
            data=wheel.read_bytes(),
            origin=LAYOUT.rel(wheel),
            sources=bases,
        )

    def patched_wheels(self) -> dict[str, str]:
        """The rebuilt Airflow wheels (``nox -s wheels``) installed in the venv: distribution -> version."""
        return {d: v for d, v in venvs.installed(self.python).items() if wheels.is_patched(v)}

    def install_wheels(self, dist: Path) -> ExecutorSource:
        """The release's own files, then its core and task-sdk wheels rebuilt with the series' files
        (``dist``) installed over them, as an image built from a private index would have them."""
        self._back_to_base()
        built = wheels.build_line(self.line, dist, core=self.core)
        venvs.pip(self.python, "install", "--quiet", "--no-deps", *map(str, built))
        found = self.patched_wheels()
        if set(found) != {pins.DISTRIBUTION, pins.SUPERVISOR.distribution}:
            raise ToolError(f"{LAYOUT.rel(self.path)}: after installing the patched wheels it has {found}")
        want = self.sources(None)
        self._check(want, "after installing the patched wheels (the overlay's)")
        return ExecutorSource(
            label="patched wheels " + ", ".join(f"{d} {v}" for d, v in sorted(found.items())),
            stage=None,
            data=want[pins.PACKAGE_PATH],
            origin=LAYOUT.rel(dist),
            sources=want,
        )

    def uninstall_wheels(self) -> None:
        """PyPI's core and task-sdk back (the pinned wheels from the cache) over patched ones."""
        if not self.patched_wheels():
            return
        pinned = venvs.release_wheels(self.core, self.sdk)
        venvs.pip(self.python, "install", "--quiet", "--no-deps", *map(str, pinned))

    def uninstall_package(self) -> None:
        if package.DIST_NAME in venvs.installed(self.python):
            venvs.pip(self.python, "uninstall", "--quiet", package.DIST_NAME)

    def _check(self, files: dict[str, bytes], when: str) -> None:
        root = venvs.purelib(self.python)
        for path, data in files.items():
            got, want = fetch.sha256_bytes((root / path).read_bytes()), fetch.sha256_bytes(data)
            if got != want:
                raise ToolError(f"{root / path}: sha256 {got[:12]} {when}, expected {want[:12]}")

    def _back_to_base(self) -> dict[str, bytes]:
        """Undo any earlier install (the package, the patched wheels, a stage copied in)."""
        self.uninstall_package()
        self.uninstall_wheels()
        bases = self.sources(0)
        # what the retired overlay installer left in a venv built before it went; the files go back below
        shutil.rmtree(self.path / install_commands.RETIRED_STATE_DIR, ignore_errors=True)
        venvs.install_sources(self.python, bases)  # no-op but for the stale pyc when already the bases
        return bases

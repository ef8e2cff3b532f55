"""The Airflow environment the e2e session runs: one venv per release line, and the executor in it.

``build/e2e/venv-<line>`` holds ``apache-airflow[postgres]`` pinned to the line's version (the
distribution, so the task SDK and the standard provider come with it) and the line's verified
``apache-airflow-core`` wheel from the cache, constrained by ``constraints/e2e-<line>.txt`` (the
release day's dependencies, :mod:`tools.e2e.lock`) or else the line's test lock. It is created
with ``uv`` on first use and reused while its marker says it was built for the same inputs.

The executor under test is then put in place:

- stage 0: the pinned base, byte for byte (``tools.fetch.read_base``);
- stage k: the file of ``tools.apply.build_stage(line, k)``, copied in;
- default (the full series): the line's overlay ``airflow_overlay/<line>/...``, installed with
  ``tools.overlay_install`` (backup, record, smoke dispatch), or copied in when that installer or
  its smoke harness is not there.

Whatever was installed before is undone first, so the venv always starts from the pinned base,
and the installed file's sha256 is checked against the intended source afterwards.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools import apply, fetch, overlay_install, pins, venvs
from tools.errors import ToolError
from tools.layout import DEFAULT as LAYOUT
from tools.overlay_install import OverlayError, OverlayInstaller, OverlayState

MARKER = ".lepatch-e2e.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ExecutorSource:
    label: str  # "stage 0 (base 3.3.2)", "stage 2 of 3.3", "full series (airflow_overlay/3.3)"
    stage: int | None  # None: the full series overlay
    data: bytes
    origin: str  # where the bytes came from

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


def resolve_source(line: pins.Line, stage: int | None) -> ExecutorSource:
    """The bytes of ``local_executor.py`` for the requested stage of ``line``."""
    if stage == 0:
        return ExecutorSource(f"stage 0 (base {line.version})", 0, fetch.read_base(line), "pinned wheel")
    if stage is None:
        overlay = LAYOUT.overlay / line.name / pins.PACKAGE_PATH
        if not overlay.is_file():
            raise ToolError(
                f"{LAYOUT.rel(overlay)}: no overlay for line {line.name} yet; "
                "run `nox -s apply -- --write`, or pass --stage 0 for the unpatched base"
            )
        n = series_length()
        what = f"{n} patches" if n is not None else "the series"
        return ExecutorSource(
            f"full series ({what}, {LAYOUT.rel(overlay)})", None, overlay.read_bytes(), LAYOUT.rel(overlay)
        )
    with tempfile.TemporaryDirectory(prefix="lepatch-e2e-stage-") as tmp:
        dest = Path(tmp) / "stage"
        apply.build_stage(line, stage, dest)
        data = (dest / pins.REPO_PATH).read_bytes()
    return ExecutorSource(
        f"stage {stage} of {line.name}", stage, data, f"python -m tools stage --stage {stage}"
    )


class AirflowVenv:
    def __init__(self, line: pins.Line, root: Path, say: Callable[[str], None]):
        self.line = line
        self.path = root / f"venv-{line.name}"
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
        if not constraints.is_file():
            constraints = LAYOUT.constraints / f"{self.line.name}.txt"
        packages = [f"apache-airflow[postgres]=={self.line.version}"]
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
        self.say(f"creating {LAYOUT.rel(self.path)}: apache-airflow[postgres]=={self.line.version} (uv)")
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
        """Put ``source`` in place of the venv's local_executor.py; returns how it was installed."""
        target = self.executor_file()
        base = self._back_to_base()
        if source.stage is None and Path(overlay_install.SMOKE_SCRIPT).is_file():
            said = io.StringIO()
            try:
                OverlayInstaller(self.python, out=said).install()
            except OverlayError as e:
                raise ToolError(f"overlay install into {LAYOUT.rel(self.path)} failed: {e}") from e
            finally:
                for ln in said.getvalue().splitlines():
                    self.say(f"  {ln}")
            how = "tools.overlay_install"
        elif source.data == base:
            how = "pinned base (unchanged)"
        else:
            venvs.install_executor(self.python, source.data)
            how = "copied (stale pyc removed)"
        got = sha256(target.read_bytes())
        if got != source.sha256:
            raise ToolError(
                f"{target}: sha256 {got[:12]} after install, expected {source.sha256[:12]} ({source.label})"
            )
        return how

    def _back_to_base(self) -> bytes:
        """Undo any earlier install (the overlay installer's restore, or a stage copied in)."""
        base = fetch.read_base(self.line)
        installer = OverlayInstaller(self.python, out=io.StringIO())
        st = installer.status()
        if st.record is not None:
            installer.restore(force=st.state is not OverlayState.INSTALLED)
        venvs.install_executor(self.python, base)  # no-op but for the stale pyc when already the base
        return base

"""Every virtual environment the tools make, and every install into one.

``make(venv, python, packages, constraints, stamp)`` is the one builder: uv (or, for the operator's
install path, ``python -m venv`` and its own pip), constrained, remade only when a stamp of what it
was made from differs; ``pip(python, ...)`` installs into a venv afterwards. Over it:
``ensure(line)`` is ``build/venvs/<line>`` from the cached, sha256-verified wheels and
``constraints/<line>.txt``; ``ensure_release(venv, core)`` any core release a line covers, with the
task-sdk release it requires (the e2e venvs, the tests of each release); ``ensure_tools()`` the
tooling tests'. ``install_sources(python, sources)`` swaps the venv's upstream files
(``airflow/executors/local_executor.py``, task-sdk's ``airflow/sdk/execution_time/supervisor.py``)
for the given bytes, which is how verify walks the stages and how the tests session installs the
overlay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tools.engine import fetch
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.pins import Line
from tools.shared.versions import version_key

TEST_PACKAGES = ("pytest", "pytest-timeout")
# tests/tools also rebuilds wheels with the `wheel` package (tools.delivery.wheels) and reads
# processes with psutil (tools.measure.e2e.procfs).
TOOLS_TEST_PACKAGES = (*TEST_PACKAGES, "psutil", "wheel")
# What upstream's own test_local_executor.py (tools.delivery.upstream_tests) and task-sdk's
# test_supervisor.py (tools.delivery.upstream_supervisor_tests) import beyond those, pinned in
# constraints/upstream-tests-<line>.txt (`python -m tools lock --upstream-tests --line X`).
UPSTREAM_TEST_PACKAGES = ("kgb", "pytest-mock", "pytest-unordered", "time-machine")
JWT_SECRET = "lepatch-tests-not-a-secret"
# why: without it uv tries to download a managed CPython, which this network refuses slowly.
UV_ENV = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
INSTALL_TIMEOUT = 1200.0  # why: an operator's pip (wheels --check-install) can backtrack for hours


def find_uv() -> str:
    """uv from PATH, else beside the running interpreter (``pip install 'nox[uv]'`` puts it there)."""
    found = shutil.which("uv")
    if found:
        return found
    beside = Path(sys.executable).parent / ("uv.exe" if os.name == "nt" else "uv")
    if beside.exists():
        return str(beside)
    raise ToolError(
        "uv not found on PATH or beside this Python; install it: python3 -m pip install 'nox[uv]'"
    )


def run(
    cmd: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> str:
    """``cmd``'s stdout; a ToolError naming the command and the end of its output if it fails."""
    args = [str(a) for a in cmd]
    name = " ".join([Path(args[0]).name, *args[1:4]]) + (" ..." if len(args) > 4 else "")
    try:
        proc = subprocess.run(
            args, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ToolError(f"`{name}` gave no result within {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()][-15:] or ["(no output)"]
        start = next((i for i, ln in enumerate(tail) if "error" in ln.lower()), 0)
        detail = "\n".join(tail[start:]).strip()
        raise ToolError(f"`{name}` failed with exit {proc.returncode}: {detail}")
    return proc.stdout


def run_uv(
    *args: str, env: Mapping[str, str] | None = None, stdin: str | None = None, cwd: Path | None = None
) -> str:
    return run([find_uv(), *args], env={**os.environ, **UV_ENV, **(env or {})}, stdin=stdin, cwd=cwd)


def pip(python: Path | str, *args: str, env: Mapping[str, str] | None = None, own_pip: bool = False) -> str:
    """``uv pip <args>`` on the venv of ``python``; with ``own_pip``, that venv's ``python -m pip <args>``."""
    if not own_pip:
        return run_uv("pip", args[0], "--python", str(python), *args[1:], env=env)
    # why: only the constraints given decide (an operator's PIP_CONSTRAINT is not the line's)
    full = {**os.environ, **(env or {}), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_REQUIRE_VIRTUALENV": "0"}
    full.pop("PIP_CONSTRAINT", None)
    return run([python, "-m", "pip", *args], env=full, timeout=INSTALL_TIMEOUT)


def installed(python: Path | str, own_pip: bool = False) -> dict[str, str]:
    """Every distribution installed in the venv of ``python``: name (lower case) -> version."""
    out = pip(python, "list", "--format", "json", own_pip=own_pip)
    return {d["name"].lower(): d["version"] for d in json.loads(out or "[]")}


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _file_digest(path: Path) -> str | None:
    return fetch.sha256_file(path) if path.exists() else None


def make(
    venv: Path,
    python: str,
    packages: Sequence[str],
    constraints: Path | Sequence[Path] | None = None,
    stamp: Mapping[str, object] | None = None,
    on_create: Callable[[], None] | None = None,
    *,
    wheels: Sequence[Path | str] = (),
    own_pip: bool = False,
) -> Path:
    """Python of ``venv`` made from ``python`` with ``wheels`` and ``packages`` (requirements or pip
    options) installed under ``constraints`` by uv. With ``stamp`` (what the wheels are), reused while
    the interpreter, packages, first constraints file and stamp are those it was made from; without,
    made afresh. ``own_pip``: made by ``python -m venv`` and installed by its own pip instead."""
    files = [constraints] if isinstance(constraints, Path) else list(constraints or ())
    stamp_file = venv / "lepatch-stamp.json"
    py = _venv_python(venv)
    if stamp is not None:
        stamp = {
            "python": _python_identity(python),
            "packages": list(packages),
            "constraints_sha256": _file_digest(files[0]) if files else None,
            **stamp,
        }
        try:
            if py.exists() and json.loads(stamp_file.read_text()) == stamp:
                return py
        except (OSError, ValueError):
            pass
    if venv.exists():
        shutil.rmtree(venv)
    if on_create is not None:
        on_create()
    venv.parent.mkdir(parents=True, exist_ok=True)
    # why own_pip: `wheels --check-install` checks what an operator's pip resolves and installs from
    # --find-links (its local-label preference, `pip check`), which uv's resolver does not stand for.
    if own_pip:
        run([python, "-m", "venv", venv], timeout=INSTALL_TIMEOUT)
    else:
        run_uv("venv", "--quiet", "-p", python, str(venv))
    pin = [arg for c in files for arg in ("-c", str(c))]
    compile_env = None if own_pip else {"UV_COMPILE_BYTECODE": "1"}
    pip(py, "install", "--quiet", *pin, *map(str, wheels), *packages, env=compile_env, own_pip=own_pip)
    if stamp is not None:
        stamp_file.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return py


def _python_identity(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0], sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def oldest_python(wheel: Path) -> str:
    """The lowest Python the wheel's ``Requires-Python`` admits ("3.11" for 3.4.0b2), else 3.10."""
    floors = [Version(s.version) for s in SpecifierSet(fetch.requires_python(wheel)) if s.operator == ">="]
    return ".".join(map(str, max(floors).release[:2])) if floors else "3.10"


def interpreter_for(wheel: Path, python: str | None = None) -> str:
    """``python`` (default: this one) if the wheel's Requires-Python admits it, else a newer
    ``python3.X`` from PATH (3.4's Airflow needs 3.11); a clear error when there is none."""
    want = tuple(int(x) for x in oldest_python(wheel).split("."))
    python = python or sys.executable
    have = _python_identity(python).split()[0]
    if tuple(int(x) for x in have.split(".")[:2]) >= want:
        return python
    for minor in range(want[1], 16):
        found = shutil.which(f"python{want[0]}.{minor}")
        if found:
            return found
    raise ToolError(
        f"{wheel.name} needs Python >= {want[0]}.{want[1]}, and {python} is {have} with no newer "
        f"python{want[0]}.X on PATH; run with a newer Python"
    )


def newer_python(minimum: tuple[int, int] = (3, 12)) -> str | None:
    """A Python >= ``minimum`` to run the tests under as well: ``python3.X`` from PATH that runs (a pyenv
    shim may not), else pyenv's own installs; the newest found, or None."""
    found: list[tuple[tuple[int, int], str]] = []
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in range(minimum[1], 16):
        name = f"python{minimum[0]}.{minor}"
        candidates = [
            shutil.which(name),
            *sorted(str(p) for p in root.glob(f"{minimum[0]}.{minor}.*/bin/{name}")),
        ]
        for candidate in filter(None, candidates):
            try:
                _python_identity(candidate)
            except (OSError, subprocess.CalledProcessError):
                continue
            found.append(((minimum[0], minor), candidate))
            break
    return max(found)[1] if found else None


def venv_name(line: Line, python: str | None = None) -> str:
    """``build/venvs/<name>``: the line's, or ``<line>-py3.13`` for another interpreter than the default."""
    if python is None:
        return line.name
    return f"{line.name}-py{'.'.join(_python_identity(python).split()[0].split('.')[:2])}"


def upstream_tests_constraints(line: Line, layout: Layout = DEFAULT) -> Path:
    """``constraints/upstream-tests-<line>.txt``: the pins of ``UPSTREAM_TEST_PACKAGES``."""
    return layout.constraints / f"upstream-tests-{line.name}.txt"


def lock_file(path: Path, how: str, layout: Layout = DEFAULT) -> Path:
    """``path``; a one-line error naming the command that makes it when it is missing."""
    if not path.exists():
        raise ToolError(f"{layout.rel(path)} is missing; make it with `python -m tools lock {how}`")
    return path


def ensure(
    line: Line | str,
    layout: Layout = DEFAULT,
    python: str | None = None,
    *,
    upstream_tests: bool = False,
    sdk: str | None = None,
    copy: int = 0,
) -> Path:
    """Python of ``build/venvs/<line>`` (``<line>-py3.X`` with another ``python``) with the pinned wheel
    and the test packages; made once. ``upstream_tests``: ``build/venvs/<line>-upstream-tests`` with
    ``UPSTREAM_TEST_PACKAGES`` as well (what upstream's own test files import). ``sdk``, another task-sdk
    release the line covers: ``build/venvs/upstream-supervisor-<sdk>`` with the newest core requiring it,
    the test packages pinned as for the line, the rest resolved as ``pip install apache-airflow-core==X``.
    ``copy`` N > 0: ``build/venvs/<line>-copyN``, the same venv again (``verify --own-tests`` runs stages
    side by side)."""
    if not isinstance(line, Line):
        line = pins.get_line(line)
    files = [lock_file(layout.constraints / f"{line.name}.txt", f"--line {line.name}", layout)]
    packages = list(TEST_PACKAGES)
    if upstream_tests:
        files.append(lock_file(upstream_tests_constraints(line, layout), "--upstream-tests", layout))
        packages += UPSTREAM_TEST_PACKAGES
    if sdk not in (None, line.sdk_version):
        core = max((c for c, s in line.core_sdk.items() if s == sdk), key=version_key)
        venv = layout.build / "venvs" / f"upstream-supervisor-{sdk}"
        return ensure_release(
            venv, core, sdk, packages=packages, constraints=files[1:], say=print, layout=layout
        )
    # why every pin's wheel: the venv's task-sdk is then the verified one the supervisor patches
    # apply to, and it is cached for the tools' tests, whose venv has no pip to download it.
    by_distribution = {pin.file.distribution: fetch.ensure_pin(pin, layout=layout) for pin in line.pins}
    name = (
        venv_name(line, python)
        + ("-upstream-tests" if upstream_tests else "")
        + (f"-copy{copy}" if copy else "")
    )
    # the core wheel, verified once, decides the interpreter too
    python = interpreter_for(by_distribution[pins.DISTRIBUTION], python)
    stamp: dict[str, object] = {"wheel_sha256": [pin.wheel_sha256 for pin in line.pins]}
    if upstream_tests:
        stamp["upstream_tests_constraints_sha256"] = _file_digest(files[1])
    return make(
        layout.build / "venvs" / name, python, packages, files, stamp, wheels=[*by_distribution.values()]
    )


def release_pins(core: str, sdk: str | None = None) -> tuple[pins.Pin, pins.Pin]:
    """The verified pins of apache-airflow-core ``core`` and of task-sdk ``sdk`` (default: the release
    ``core`` requires), whichever lines pin them; a one-line error for a release none pins."""
    line = next((ln for ln in pins.LINES if core in (ln.version, *ln.covers)), None)
    if line is None:
        raise ToolError(f"apache-airflow-core {core} is not a release any line pins")
    sdk = sdk or line.core_sdk.get(core)
    sdk_pin = next(
        (
            p
            for ln in pins.LINES
            for p in (ln.pin(pins.SUPERVISOR), *ln.sdk_release_pins)
            if p is not None and sdk in (p.version, *p.covers)
        ),
        None,
    )
    if sdk_pin is None:
        raise ToolError(
            f"apache-airflow-task-sdk {sdk} (for apache-airflow-core {core}) is not a pinned release"
        )
    return line.pins[0], sdk_pin


def release_wheels(core: str, sdk: str | None = None, layout: Layout = DEFAULT) -> list[Path]:
    """The verified wheels of apache-airflow-core ``core`` and of task-sdk ``sdk`` (default: the release
    ``core`` requires), in the cache."""
    sdk = sdk or pins.get_line(core).core_sdk[core]
    return [fetch.ensure_pin(p, v, layout) for p, v in zip(release_pins(core, sdk), (core, sdk), strict=True)]


def ensure_release(
    venv: Path,
    core: str,
    sdk: str | None = None,
    *,
    packages: Sequence[str] = (),
    constraints: Path | Sequence[Path] | None = None,
    python: str | None = None,
    say: Callable[[str], None] | None = None,
    layout: Layout = DEFAULT,
) -> Path:
    """Python of ``venv`` with apache-airflow-core ``core`` and task-sdk ``sdk`` (default: the release
    ``core`` requires) from their verified wheels, and ``packages``, constrained by ``constraints``
    (without: the resolution of an operator's ``pip install apache-airflow-core==X``); made once (a
    stamp). The interpreter: ``python``, else one the core wheel admits."""
    sdk = sdk or pins.get_line(core).core_sdk[core]
    wheels = release_wheels(core, sdk, layout)
    python = python or interpreter_for(wheels[0])
    stamp = {
        "release": [core, sdk],
        "wheel_sha256": [
            p.wheel_sha256 if v == p.version else p.covers[v]
            for p, v in zip(release_pins(core, sdk), (core, sdk), strict=True)
        ],
    }
    what = ", ".join([f"apache-airflow-core {core}", f"apache-airflow-task-sdk {sdk}", *packages])
    creating = None if say is None else (lambda: say(f"creating {layout.rel(venv)}: {what} (uv)"))
    return make(venv, python, packages, constraints, stamp, creating, wheels=wheels)


def ensure_tools(layout: Layout = DEFAULT, python: str | None = None) -> Path:
    """A venv with only pytest, pytest-timeout and wheel (tests/tools needs no Airflow), and every pinned
    wheel in the cache: the tests read the bases from them, and this venv has no pip to fetch one."""
    fetch.ensure_every_pin(layout)
    venv = layout.build / "venvs" / "tools"
    return make(venv, python or sys.executable, TOOLS_TEST_PACKAGES, layout.constraints / "tools.txt", {})


def purelib(python: Path | str) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def install_sources(python: Path | str, sources: Mapping[str, bytes]) -> list[Path]:
    """Make each ``path -> bytes`` of ``sources`` the venv's file at that installed path."""
    root = purelib(python)
    targets = []
    for rel, data in sources.items():
        target = root / rel
        if not target.exists():
            raise ToolError(f"{python} has no {rel}: not a venv made by tools.engine.venvs.ensure")
        if target.read_bytes() != data:
            # why: uv hardlinks installed files to its cache; writing through would change every
            # venv made from it. A new file renamed over the old one changes this venv alone.
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            pyc.unlink()
        targets.append(target)
    return targets


def install_executor(python: Path | str, source: bytes) -> Path:
    """Make ``source`` the venv's ``airflow/executors/local_executor.py``; return its path."""
    return install_sources(python, {pins.PACKAGE_PATH: source})[0]


def test_env(airflow_home: Path, layout: Layout = DEFAULT) -> dict[str, str]:
    """Environment for running the executor tests: no database, tools importable."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(layout.root), env.get("PYTHONPATH", "")])),
            # The supervisor tests time [workers] min_heartbeat_interval's default wait.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "5",
        }
    )
    return env


def _cmd_venv(args: argparse.Namespace) -> int:
    print(ensure_tools() if args.line == "tools" else ensure(args.line))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("venv", help="make (or reuse) a line's test venv and print its python")
    p.add_argument("--line", required=True, help="a release line, or 'tools' for the tooling tests")
    p.set_defaults(func=_cmd_venv)

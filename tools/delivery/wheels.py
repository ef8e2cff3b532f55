"""``nox -s wheels``: Airflow's own wheels from PyPI with the series' files in place, per covered release.

Every core release a line covers (the base and its ``covers``) and the task-sdk release it pins
exactly (``Line.core_sdk``) gets a rebuilt wheel of the same name and version plus a local label,
``apache_airflow_core-3.3.2+lepatch.<N>`` and ``apache_airflow_task_sdk-1.3.2+lepatch.<N>``. Core's
``Requires-Dist: apache-airflow-task-sdk==1.3.2`` is left alone: PEP 440's ``==`` without a local
label matches ``1.3.2+lepatch.<N>`` and installers prefer the local build, so an unchanged
``pip install apache-airflow-core==3.3.2`` with the output folder as ``--find-links`` (or the
``simple/`` index beside it as an extra index) installs both patched wheels.

Each source wheel is the sha256-checked one of ``tools/shared/pins.py`` (``tools.engine.fetch``),
and each replaced file is what the overlay tree holds for that distribution and release: a core
file at ``airflow_overlay/<line>/<path>``, a task-sdk file at the same place for the releases the
line's base supervisor covers and under ``airflow_overlay/<line>/task-sdk-<v>/`` for the others.
Whatever upstream file ``pins.UPSTREAM_FILES`` names and the overlay carries goes in; nothing here
lists files. The `wheel` package unpacks (checking the source RECORD), repacks and rewrites RECORD;
``SOURCE_DATE_EPOCH`` (the newest patch's date, as ``nox -s package``) fixes every timestamp and
it writes entries sorted, so the same checkout builds the same bytes.

``<N>`` is ``nox -s package``'s post-release number (the series length plus the re-cut offset), so a
later series sorts higher. Each dist-info carries ``lepatch.json``: the series, the patches that
touch the distribution's files, the source wheel's sha256, and each file's sha256 before and after.
``inspect`` reads that record back from an installed environment (without importing Airflow) and
checks each file against it: pip has no command that does.
"""

from __future__ import annotations

import functools
import hashlib
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.delivery import package
from tools.engine import apply, fetch, series
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.versions import version_key

LABEL = "lepatch"
RECORD_NAME = "lepatch.json"  # inside each rebuilt wheel's .dist-info
SCHEMA = 1
DEFAULT_OUT = DEFAULT.root / "dist" / "wheels"
GENERATOR = "lepatch tools/delivery/wheels.py"


class WheelsError(ToolError):
    """A wheel cannot be rebuilt as derived; one line naming the release and path at fault."""


def local_label(layout: Layout = DEFAULT) -> str:
    """``lepatch.<N>``: the same number as the provider package's ``.post<N>``."""
    return f"{LABEL}.{package.series_length(layout)}"


def split_local(version: str) -> tuple[str, str]:
    """``"1.3.2+lepatch.19"`` -> ``("1.3.2", "lepatch.19")``; no label -> ``(version, "")``."""
    public, _, local = version.partition("+")
    return public, local


def is_patched(version: str | None) -> bool:
    """Whether an installed distribution's version is one of these rebuilt wheels."""
    return bool(version) and split_local(version or "")[1].startswith(f"{LABEL}.")


@dataclass(frozen=True)
class Target:
    """One wheel to rebuild: an upstream release and the files that replace its own."""

    line: str
    distribution: str
    version: str
    wheel_sha256: str  # of the source wheel on PyPI, as pinned
    files: dict[str, bytes]  # installed path -> the overlay's bytes
    overlay_root: Path  # where those came from
    # installed path -> sha256 the release's own file must have: the base the overlay was made from
    bases: dict[str, str] = field(default_factory=dict)


def overlay_root(line: pins.Line, distribution: str, version: str, layout: Layout = DEFAULT) -> Path:
    """Where the overlay keeps ``distribution``'s files for ``version`` of it."""
    root = layout.overlay / line.name
    if distribution == pins.SUPERVISOR.distribution:
        pin = line.supervisor_pin(version)
        if pin is None:
            raise WheelsError(
                f"{distribution} {version}: line {line.name} has no verified supervisor for it "
                f"(verified: {', '.join(line.sdk_versions) or 'none'})"
            )
        if pin != line.pin(pins.SUPERVISOR):
            return root / apply.sdk_release_dir(version)
    return root


def overlay_files(root: Path, distribution: str) -> dict[str, bytes]:
    """The overlay's files under ``root`` that ``distribution`` ships, by installed path."""
    return {
        f.package_path: (root / f.package_path).read_bytes()
        for f in pins.UPSTREAM_FILES
        if f.distribution == distribution and (root / f.package_path).is_file()
    }


def release_bases(line: pins.Line, distribution: str, version: str) -> dict[str, str]:
    """Installed path -> the pinned sha256 of each upstream file whose overlay fits ``version`` of
    ``distribution``: the pin's own release or one it covers (the API server's file, which changes
    between patch releases, fits the line's base alone)."""
    out = {}
    for f in pins.UPSTREAM_FILES:
        if f.distribution != distribution:
            continue
        pin = line.supervisor_pin(version) if f is pins.SUPERVISOR else line.pin(f)
        if pin is not None and version in (pin.version, *pin.covers):
            out[f.package_path] = pin.source_sha256
    return out


def _core_wheel_sha256(line: pins.Line, version: str) -> str:
    return line.wheel_sha256 if version == line.version else line.covers[version]


def _sdk_wheel_sha256(line: pins.Line, version: str) -> str:
    pin = line.supervisor_pin(version)
    assert pin is not None  # overlay_root refused it otherwise
    return pin.wheel_sha256 if version == pin.version else pin.covers[version]


def targets(line: pins.Line, layout: Layout = DEFAULT) -> list[Target]:
    """Every wheel the line's overlay rebuilds: each covered core release, each task-sdk it pins."""
    out: list[Target] = []
    core, sdk = pins.DISTRIBUTION, pins.SUPERVISOR.distribution
    core_versions = sorted({line.version, *line.covers}, key=version_key)
    releases = [(core, v) for v in core_versions]
    releases += [
        (sdk, v)
        for v in sorted({line.core_sdk[c] for c in core_versions if c in line.core_sdk}, key=version_key)
    ]
    for dist, version in releases:
        root = overlay_root(line, dist, version, layout)
        bases = release_bases(line, dist, version)
        files = {path: data for path, data in overlay_files(root, dist).items() if path in bases}
        if files:
            sha = (_core_wheel_sha256 if dist == core else _sdk_wheel_sha256)(line, version)
            out.append(Target(line.name, dist, version, sha, files, root, bases))
    if not out:
        raise WheelsError(
            f"{layout.rel(layout.overlay / line.name)}: no overlay files for line {line.name}; "
            "run `nox -s apply -- --write` first"
        )
    return out


def patches_touching(distribution: str, layout: Layout, installed: Collection[str]) -> list[str]:
    """The series' patches that change a file ``distribution`` ships of ``installed`` paths (what one
    wheel replaces), in series order."""
    paths = {
        f.repo_path
        for f in pins.UPSTREAM_FILES
        if f.distribution == distribution and f.package_path in installed
    }
    return [p.name for p in series.load_series(layout).ordered() if paths & set(p.touched)]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _wheel_python() -> str:
    """An interpreter with the `wheel` package: this one (``nox -s wheels`` installs it), else the
    tools' venv, which has it pinned by constraints/tools.txt (``nox -s e2e`` runs without a venv)."""
    if importlib.util.find_spec("wheel") is not None:
        return sys.executable
    from tools.engine import venvs

    return str(venvs.ensure_tools())


def _wheel_cli(*args: str, env: Mapping[str, str] | None = None) -> None:
    """Run the `wheel` package's command line (its public interface)."""
    proc = subprocess.run(
        [_wheel_python(), "-m", "wheel", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        if "No module named wheel" in last:
            last += " (run `nox -s wheels`, which installs it pinned by constraints/tools.txt)"
        raise WheelsError(f"`wheel {args[0]}` failed: {last}")


def rebuild(
    source: Path,
    replacements: Mapping[str, bytes],
    label: str,
    out: Path,
    provenance: Mapping[str, object],
    epoch: int,
    bases: Mapping[str, str],
) -> Path:
    """Rebuild ``source`` with ``replacements`` in place and ``+label`` on its version, into ``out``.

    Every replaced path must exist in the source wheel and be the file the overlay was made from
    (``bases``: path -> sha256). Returns the new wheel's path.
    """
    with tempfile.TemporaryDirectory(prefix="lepatch-wheel-") as tmp:
        work = Path(tmp)
        _wheel_cli("unpack", str(source), "--dest", str(work))
        (unpacked,) = [p for p in work.iterdir() if p.is_dir()]
        files = []
        for rel, data in sorted(replacements.items()):
            target = unpacked / rel
            if not target.is_file():
                raise WheelsError(f"{source.name} has no {rel}: the overlay does not fit this release")
            before = target.read_bytes()
            if _sha256(before) != bases.get(rel):
                raise WheelsError(
                    f"{source.name}: {rel} is not the pinned base the overlay was made from "
                    f"(sha256 {_sha256(before)[:12]}, pinned {bases.get(rel, 'none')[:12]})"
                )
            target.write_bytes(data)  # why: writing through keeps the mode the wheel gave it
            files.append({"path": rel, "sha256_before": _sha256(before), "sha256_after": _sha256(data)})
        (dist_info,) = unpacked.glob("*.dist-info")
        record = {
            "schema": SCHEMA,
            "generator": GENERATOR,
            **provenance,
            "source_wheel": {"name": source.name, "sha256": _sha256(source.read_bytes())},
            "files": files,
        }
        meta = dist_info / RECORD_NAME
        meta.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        meta.chmod(0o644)
        staging = work / "out"
        staging.mkdir()
        _wheel_cli(
            "pack",
            str(unpacked),
            "--dest-dir",
            str(staging),
            "--local-version",
            label,
            env={"SOURCE_DATE_EPOCH": str(epoch)},
        )
        (built,) = staging.glob("*.whl")
        out.mkdir(parents=True, exist_ok=True)
        final = out / built.name
        shutil.move(built, final)
        return final


# Fetches the verified source wheel of (distribution, version, sha256); the cache by default.
Fetch = Callable[[str, str, str], Path]


def build_line(
    line: pins.Line,
    out: Path,
    layout: Layout = DEFAULT,
    fetch_wheel: Fetch | None = None,
    core: str | None = None,
) -> list[Path]:
    """Rebuild every wheel of ``line`` into ``out`` (with ``core``, that core release's and its
    task-sdk's alone); returns the wheels' paths."""
    get = fetch_wheel or (
        lambda dist, version, sha: fetch.ensure_verified(version, sha, layout, distribution=dist)
    )
    label = local_label(layout)
    epoch = int(package.source_date(layout).timestamp())
    built = []
    wanted = {(pins.DISTRIBUTION, core), (pins.SUPERVISOR.distribution, line.core_sdk.get(core or "", ""))}
    for t in targets(line, layout):
        if core is not None and (t.distribution, t.version) not in wanted:
            continue
        # why: an earlier series' build of the same release would sort below, but clutter the index
        for stale in out.glob(f"{t.distribution.replace('-', '_')}-{t.version}+{LABEL}.*-*.whl"):
            stale.unlink()
        source = get(t.distribution, t.version, t.wheel_sha256)
        provenance = {
            "series": {"label": label, "patches": patches_touching(t.distribution, layout, t.files)},
            "line": line.name,
            "distribution": t.distribution,
            "upstream_version": t.version,
            "overlay": layout.rel(t.overlay_root),
        }
        built.append(rebuild(source, t.files, label, out, provenance, epoch, t.bases))
    return built


def _project(wheel_name: str) -> str:
    """PEP 503's normalized project name of a wheel file name."""
    return re.sub(r"[-_.]+", "-", wheel_name.split("-", 1)[0]).lower()


def _page(title: str, body: str) -> str:
    return f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n{body}</body></html>\n"


def write_index(out: Path) -> Path:
    """``out/simple/``: a PEP 503 index of the wheels in ``out`` (links back to them, with sha256)."""
    simple = out / "simple"
    by_project: dict[str, list[Path]] = {}
    for wheel in sorted(out.glob("*.whl")):
        by_project.setdefault(_project(wheel.name), []).append(wheel)
    if simple.exists():
        shutil.rmtree(simple)
    simple.mkdir(parents=True)
    rows = []
    for project, wheels in sorted(by_project.items()):
        (simple / project).mkdir()
        links = "".join(
            f'<a href="../../{html.escape(w.name)}#sha256={fetch.sha256_file(w)}">'
            f"{html.escape(w.name)}</a><br>\n"
            for w in wheels
        )
        (simple / project / "index.html").write_text(_page(f"Links for {project}", links))
        rows.append(f'<a href="{project}/">{project}</a><br>\n')
    (simple / "index.html").write_text(_page("Simple index", "".join(rows)))
    return simple


def read_record(wheel: Path) -> dict[str, Any]:
    """The ``lepatch.json`` a rebuilt wheel carries."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(f".dist-info/{RECORD_NAME}")), None)
        if name is None:
            raise WheelsError(f"{wheel.name}: no {RECORD_NAME} (not a wheel this tool rebuilt)")
        data: dict[str, Any] = json.loads(zf.read(name))
        return data


def build(lines: list[pins.Line], out: Path, layout: Layout = DEFAULT) -> list[Path]:
    """Rebuild every line's wheels into ``out`` (an earlier build of a release replaced) and index them."""
    out.mkdir(parents=True, exist_ok=True)
    built = [w for line in lines for w in build_line(line, out, layout)]
    write_index(out)
    return built


# -------------------------------------------------------------------- an installed environment

# Runs inside the target environment (``python -I``, so PYTHONPATH cannot point elsewhere): each
# distribution's version, its site directory and the record a patched wheel carries, if any.
_INSPECT = """
import importlib.metadata as md, importlib.util, json, sys
out = {"prefix": sys.prefix, "pip": importlib.util.find_spec("pip") is not None, "dists": {}}
for name in %(dists)r:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    out["dists"][name] = [dist.version, str(dist.locate_file("")), dist.read_text(%(record)r)]
print(json.dumps(out))
"""


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


@dataclass
class Installed:
    """Airflow's core and task-sdk as one environment has them (read from their metadata)."""

    python: Path
    prefix: Path
    has_pip: bool
    versions: dict[str, str]  # distribution -> version, for those installed
    sites: dict[str, Path]  # distribution -> the directory its files are installed under
    records: dict[str, dict[str, Any]]  # distribution -> the lepatch.json of a patched wheel

    def pip_install(self) -> str:
        """How an operator installs into this environment: its own pip, or uv's where it has none."""
        return f"{self.python} -m pip install" if self.has_pip else f"uv pip install --python {self.python}"

    def changed(self) -> list[str]:
        """Each file a patched wheel recorded that differs from what it installed, one phrase each."""
        out = []
        for dist, rec in sorted(self.records.items()):
            for entry in rec.get("files", []):
                path = self.sites[dist] / entry["path"]
                got = _sha256(path.read_bytes()) if path.is_file() else "missing"
                if got != entry["sha256_after"]:
                    out.append(
                        f"{path} (sha256 {got[:12]}, the wheel installed {entry['sha256_after'][:12]})"
                    )
        return out

    def describe(self) -> str:
        """The patched wheels found and whether their files are unchanged, in one line."""
        said = []
        for dist in (pins.DISTRIBUTION, pins.SUPERVISOR.distribution):
            version = self.versions.get(dist)
            if version is None:
                said.append(f"{dist} not installed")
            elif dist in self.records:
                rec = self.records[dist]
                n, patches = len(rec.get("files", [])), len(rec.get("series", {}).get("patches", []))
                said.append(f"{dist} {version} ({n} file(s), {patches} patch(es))")
            else:
                said.append(
                    f"{dist} {version}" + (" without its lepatch.json" if is_patched(version) else "")
                )
        changed = self.changed()
        tail = f"; changed since: {', '.join(changed)}" if changed else ""
        if self.records and not changed:
            tail = "; every file as the patched wheels installed it"
        return f"{self.prefix}: " + ", ".join(said) + tail


def inspect(python: Path) -> Installed:
    """Read core's and task-sdk's versions and patched-wheel records from ``python``'s environment
    without importing Airflow."""
    if problem := interpreter_problem(python):
        raise WheelsError(problem)
    dists = [pins.DISTRIBUTION, pins.SUPERVISOR.distribution]
    try:
        proc = subprocess.run(
            [str(python), "-I", "-c", _INSPECT % {"dists": dists, "record": RECORD_NAME}],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WheelsError(f"{python}: cannot run it to read the installed versions ({exc})") from exc
    if proc.returncode != 0:
        raise WheelsError(f"{python}: reading the installed versions failed: {proc.stderr.strip()[-300:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    records = {}
    for dist, (version, _, text) in data["dists"].items():
        if text is not None and is_patched(version):
            try:
                records[dist] = json.loads(text)
            except ValueError as exc:
                raise WheelsError(
                    f"{python}: {dist} {version}'s {RECORD_NAME} is unreadable ({exc})"
                ) from exc
    return Installed(
        python=python,
        prefix=Path(data["prefix"]),
        has_pip=bool(data["pip"]),
        versions={d: v for d, (v, _, _) in data["dists"].items()},
        sites={d: Path(site) for d, (_, site, _) in data["dists"].items()},
        records=records,
    )

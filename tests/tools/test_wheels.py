"""``nox -s wheels``: small synthetic wheels rebuilt with a synthetic overlay, read back (no network)."""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tools.delivery import install_commands, package, wheels
from tools.shared import pins
from tools.shared.layout import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from series_fixtures import Project

CORE, SDK = pins.DISTRIBUTION, pins.SUPERVISOR.distribution
EXECUTOR, SUPERVISOR = pins.EXECUTOR.package_path, pins.SUPERVISOR.package_path
OTHER = "airflow/__init__.py"  # a file the series leaves alone
PY_DIR = f"python{sys.version_info.major}.{sys.version_info.minor}"


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(out: Path, dist: str, version: str, files: dict[str, bytes], requires: str = "") -> Path:
    """A minimal valid wheel: the files, METADATA, WHEEL and a RECORD with every hash."""
    name = dist.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n{requires}\nA description.\n"
    members = {
        **files,
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for p, d in members.items()
    ]
    members[f"{info}/RECORD"] = ("".join(rows) + f"{info}/RECORD,,\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in members.items():
            zf.writestr(p, d)
    return path


def upstream(version: str, path: str) -> bytes:
    return f"# upstream {path} of {version}\n".encode()


@dataclasses.dataclass
class Synthetic:
    layout: Layout
    line: pins.Line
    sources: dict[tuple[str, str], Path]  # (distribution, version) -> the "PyPI" wheel

    def fetch(self, distribution: str, version: str, sha256: str) -> Path:
        path = self.sources[distribution, version]
        assert _hash(path.read_bytes()) == sha256, f"{path.name}: not the pinned wheel"
        return path


@pytest.fixture
def synthetic(tmp_path: Path) -> Synthetic:
    """Line 9.9: core 9.9.0 and 9.9.1 (one executor), each requiring its own task-sdk (2.0.0, 2.0.1);
    the line's base supervisor is 2.0.1's, 2.0.0 has its own under task-sdk-2.0.0/. Two patches,
    one per distribution."""
    project = Project(tmp_path / "repo")
    project.add("0001-executor.patch", {pins.EXECUTOR.repo_path: "line 1 changed\n"})
    project.add("0002-supervisor.patch", {pins.SUPERVISOR.repo_path: "supervised\n"})
    layout = project.layout
    src = tmp_path / "pypi"
    sources = {}
    for v, sdk in (("9.9.0", "2.0.0"), ("9.9.1", "2.0.1")):
        core_files = {EXECUTOR: upstream("9.9", EXECUTOR), OTHER: upstream(v, OTHER)}
        req = f"Requires-Dist: {SDK}=={sdk}"
        sources[CORE, v] = make_wheel(src, CORE, v, core_files, req)
        sources[SDK, sdk] = make_wheel(src, SDK, sdk, {SUPERVISOR: upstream(sdk, SUPERVISOR)})
    sha = {k: _hash(p.read_bytes()) for k, p in sources.items()}
    line = pins.Line(
        name="9.9",
        version="9.9.1",
        wheel_sha256=sha[CORE, "9.9.1"],
        source_sha256=_hash(upstream("9.9", EXECUTOR)),
        branch="v9-9-test",
        covers={"9.9.0": sha[CORE, "9.9.0"]},
        sdk_version="2.0.1",
        sdk_wheel_sha256=sha[SDK, "2.0.1"],
        sdk_source_sha256=_hash(upstream("2.0.1", SUPERVISOR)),
        sdk_releases={"2.0.0": sha[SDK, "2.0.0"]},
        sdk_release_sources={"2.0.0": _hash(upstream("2.0.0", SUPERVISOR))},
        core_sdk={"9.9.0": "2.0.0", "9.9.1": "2.0.1"},
    )
    overlay = layout.overlay / "9.9"
    for rel, data in (
        (EXECUTOR, b"# patched executor\n"),
        (SUPERVISOR, b"# patched supervisor of 2.0.1\n"),
        (f"task-sdk-2.0.0/{SUPERVISOR}", b"# patched supervisor of 2.0.0\n"),
    ):
        (overlay / rel).parent.mkdir(parents=True, exist_ok=True)
        (overlay / rel).write_bytes(data)
    return Synthetic(layout, line, sources)


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def build(s: Synthetic, out: Path) -> dict[str, Path]:
    return {p.name: p for p in wheels.build_line(s.line, out, s.layout, s.fetch)}


def test_every_covered_release_is_rebuilt_with_its_own_files(synthetic: Synthetic, tmp_path: Path) -> None:
    built = build(synthetic, tmp_path / "out")
    n = 2 + package.RECUT_OFFSET  # two patches
    assert n == package.series_length(synthetic.layout)
    label = f"lepatch.{n}"
    assert sorted(built) == sorted(
        f"{d.replace('-', '_')}-{v}+{label}-py3-none-any.whl"
        for d, v in ((CORE, "9.9.0"), (CORE, "9.9.1"), (SDK, "2.0.0"), (SDK, "2.0.1"))
    )
    sdk_200 = members(built[f"apache_airflow_task_sdk-2.0.0+{label}-py3-none-any.whl"])
    assert sdk_200[SUPERVISOR] == b"# patched supervisor of 2.0.0\n"  # its own, not the base's
    sdk_201 = members(built[f"apache_airflow_task_sdk-2.0.1+{label}-py3-none-any.whl"])
    assert sdk_201[SUPERVISOR] == b"# patched supervisor of 2.0.1\n"
    core = members(built[f"apache_airflow_core-9.9.0+{label}-py3-none-any.whl"])
    assert core[EXECUTOR] == b"# patched executor\n"
    assert core[OTHER] == upstream("9.9.0", OTHER)  # everything else as upstream built it
    meta = Parser().parsestr(core[f"apache_airflow_core-9.9.0+{label}.dist-info/METADATA"].decode())
    assert meta["Version"] == f"9.9.0+{label}"
    # Core keeps requiring the task-sdk release as upstream wrote it: the patched one satisfies it.
    assert meta["Requires-Dist"] == f"{SDK}==2.0.0"
    assert Version(f"2.0.0+{label}") in SpecifierSet("==2.0.0")


def test_record_is_rewritten_and_lepatch_json_says_what_changed(synthetic: Synthetic, tmp_path: Path) -> None:
    built = build(synthetic, tmp_path / "out")
    for wheel in built.values():
        files = members(wheel)
        (record_name,) = [n for n in files if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(files[record_name].decode())))
        assert {r[0] for r in rows} == set(files)
        for path, digest, size in rows:
            if path == record_name:
                continue
            expect = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expect}", len(files[path])), path
    rec = wheels.read_record(built[next(n for n in built if n.startswith("apache_airflow_task_sdk-2.0.0"))])
    assert rec["distribution"] == SDK and rec["upstream_version"] == "2.0.0" and rec["line"] == "9.9"
    assert rec["series"] == {
        "label": wheels.local_label(synthetic.layout),
        "patches": ["0002-supervisor.patch"],
    }
    assert rec["files"] == [
        {
            "path": SUPERVISOR,
            "sha256_before": _hash(upstream("2.0.0", SUPERVISOR)),
            "sha256_after": _hash(b"# patched supervisor of 2.0.0\n"),
        }
    ]
    assert rec["source_wheel"] == {
        "name": synthetic.sources[SDK, "2.0.0"].name,
        "sha256": synthetic.line.sdk_releases["2.0.0"],
    }
    core = wheels.read_record(built[next(n for n in built if n.startswith("apache_airflow_core-9.9.1"))])
    assert core["series"]["patches"] == ["0001-executor.patch"]


def test_the_same_checkout_builds_the_same_bytes(synthetic: Synthetic, tmp_path: Path) -> None:
    one = build(synthetic, tmp_path / "one")
    two = build(synthetic, tmp_path / "two")
    assert {n: p.read_bytes() for n, p in one.items()} == {n: p.read_bytes() for n, p in two.items()}


def test_a_later_series_sorts_higher_and_replaces_the_earlier_build(
    synthetic: Synthetic, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    before = wheels.local_label(synthetic.layout)
    build(synthetic, out)
    series = synthetic.layout.series_file
    series.write_text(series.read_text() + "0003-more.patch\n")
    after = wheels.local_label(synthetic.layout)
    assert Version(f"9.9.1+{after}") > Version(f"9.9.1+{before}") > Version("9.9.1")
    build(synthetic, out)
    names = sorted(p.name for p in out.glob("*.whl"))
    assert len(names) == 4 and all(f"+{after}-" in n for n in names), names


def test_a_core_file_pinned_on_the_base_release_alone_goes_into_that_wheel_alone(
    synthetic: Synthetic, tmp_path: Path
) -> None:
    """The API server's file (patch 11) changes between a line's patch releases: the overlay's copy is
    the base's patched, so it goes into the base's core wheel, and every other release keeps its own."""
    auth = pins.AUTH_MANAGER.package_path
    for v in ("9.9.0", "9.9.1"):
        src = synthetic.sources[CORE, v]
        files = {n: d for n, d in members(src).items() if ".dist-info/" not in n}
        files[auth] = upstream(v, auth)
        req = f"Requires-Dist: {SDK}=={synthetic.line.core_sdk[v]}"
        synthetic.sources[CORE, v] = make_wheel(tmp_path / "pypi2", CORE, v, files, req)
    synthetic.line = dataclasses.replace(
        synthetic.line,
        wheel_sha256=_hash(synthetic.sources[CORE, "9.9.1"].read_bytes()),
        covers={"9.9.0": _hash(synthetic.sources[CORE, "9.9.0"].read_bytes())},
        auth_source_sha256=_hash(upstream("9.9.1", auth)),
    )
    target = synthetic.layout.overlay / "9.9" / auth
    target.parent.mkdir(parents=True)
    target.write_bytes(b"# patched base_auth_manager of 9.9.1\n")
    built = build(synthetic, tmp_path / "out")
    base = next(p for n, p in built.items() if n.startswith("apache_airflow_core-9.9.1"))
    assert members(base)[auth] == b"# patched base_auth_manager of 9.9.1\n"
    assert [f["path"] for f in wheels.read_record(base)["files"]] == sorted([EXECUTOR, auth])
    covered = next(p for n, p in built.items() if n.startswith("apache_airflow_core-9.9.0"))
    assert members(covered)[auth] == upstream("9.9.0", auth)
    assert [f["path"] for f in wheels.read_record(covered)["files"]] == [EXECUTOR]
    # task-sdk ships no such file: its wheels are untouched by it
    sdk = next(p for n, p in built.items() if n.startswith("apache_airflow_task_sdk-2.0.1"))
    assert auth not in members(sdk)


def test_a_release_whose_file_is_not_the_pinned_base_is_refused(synthetic: Synthetic, tmp_path: Path) -> None:
    """The overlay replaces only the file it was made from: a source wheel's own file must be the pin's."""
    src = synthetic.sources[CORE, "9.9.1"]
    files = {n: d for n, d in members(src).items() if ".dist-info/" not in n}
    files[EXECUTOR] = b"# someone else's executor\n"
    synthetic.sources[CORE, "9.9.1"] = make_wheel(
        tmp_path / "pypi3", CORE, "9.9.1", files, f"Requires-Dist: {SDK}==2.0.1"
    )
    synthetic.line = dataclasses.replace(
        synthetic.line, wheel_sha256=_hash(synthetic.sources[CORE, "9.9.1"].read_bytes())
    )
    with pytest.raises(
        wheels.WheelsError,
        match=r"apache_airflow_core-9\.9\.1-py3-none-any\.whl: .*local_executor\.py is not the pinned base",
    ):
        build(synthetic, tmp_path / "out")


def test_an_overlay_file_the_release_lacks_is_refused(synthetic: Synthetic, tmp_path: Path) -> None:
    src = synthetic.sources[SDK, "2.0.0"]
    bare = make_wheel(tmp_path / "bare", SDK, "2.0.0", {OTHER: b"x\n"})
    synthetic.sources[SDK, "2.0.0"] = bare
    synthetic.line = dataclasses.replace(synthetic.line, sdk_releases={"2.0.0": _hash(bare.read_bytes())})
    with pytest.raises(wheels.WheelsError, match=rf"{bare.name} has no {SUPERVISOR}"):
        build(synthetic, tmp_path / "out")
    assert src.is_file()


def test_a_task_sdk_release_without_a_verified_supervisor_is_refused(
    synthetic: Synthetic, tmp_path: Path
) -> None:
    synthetic.line = dataclasses.replace(synthetic.line, sdk_releases={}, sdk_release_sources={})
    with pytest.raises(
        wheels.WheelsError, match=r"apache-airflow-task-sdk 2\.0\.0: line 9\.9 has no verified"
    ):
        build(synthetic, tmp_path / "out")


def test_the_index_is_pep_503(synthetic: Synthetic, tmp_path: Path) -> None:
    out = tmp_path / "out"
    built = build(synthetic, out)
    simple = wheels.write_index(out)
    root = (simple / "index.html").read_text()
    assert '<a href="apache-airflow-core/">' in root and '<a href="apache-airflow-task-sdk/">' in root
    page = (simple / "apache-airflow-task-sdk" / "index.html").read_text()
    for name, path in built.items():
        if name.startswith("apache_airflow_task_sdk"):
            assert f'href="../../{name}#sha256={_hash(path.read_bytes())}"' in page
            assert (simple / "apache-airflow-task-sdk" / "../.." / name).resolve() == path.resolve()
    assert "apache_airflow_core" not in page


# ------------------------------------------------------------- an installed environment


def fake_installed(root: Path, wheel: Path) -> Path:
    """A venv with ``wheel``'s files and dist-info unpacked into site-packages (no pip)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / PY_DIR / "site-packages"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return root / "bin" / "python"


def test_inspect_reports_patched_wheels_and_a_file_changed_since(tmp_path: Path) -> None:
    label = "lepatch.19"
    version = f"{pins.PRIMARY.version}+{label}"
    after = b"# patched executor\n"
    wheel = make_wheel(tmp_path / "w", CORE, version, {EXECUTOR: after})
    python = fake_installed(tmp_path / "env", wheel)
    site = python.parents[1] / "lib" / PY_DIR / "site-packages"
    rec = {
        "series": {"label": label, "patches": ["a", "b"]},
        "files": [{"path": EXECUTOR, "sha256_before": "0" * 64, "sha256_after": _hash(after)}],
    }
    (site / f"apache_airflow_core-{version}.dist-info" / wheels.RECORD_NAME).write_text(json.dumps(rec))
    env = wheels.inspect(python)
    assert env.versions == {CORE: version} and not env.changed() and not env.has_pip
    assert f"{CORE} {version} (1 file(s), 2 patch(es))" in env.describe()
    assert env.pip_install() == f"uv pip install --python {python}"
    (site / EXECUTOR).write_bytes(after + b"# edited\n")
    (changed,) = wheels.inspect(python).changed()
    assert changed.startswith(f"{site / EXECUTOR} (sha256 ") and f"installed {_hash(after)[:12]})" in changed
    report, rc = install_commands.environment_report(wheels.inspect(python))
    assert rc == 3 and "changed since" in report


def test_a_local_version_without_the_record_is_not_taken_for_the_patched_wheels(tmp_path: Path) -> None:
    version = f"{pins.PRIMARY.version}+lepatch.19"
    python = fake_installed(tmp_path / "env", make_wheel(tmp_path / "w", CORE, version, {EXECUTOR: b"x\n"}))
    env = wheels.inspect(python)
    assert not env.records and "without its lepatch.json" in env.describe()


def test_inspect_reads_one_record_per_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = pins.UpstreamFile(
        "revoked_token.py", CORE, "airflow/models/revoked_token.py", "x/revoked_token.py", "x", "tests/x"
    )
    monkeypatch.setattr(pins, "UPSTREAM_FILES", (*pins.UPSTREAM_FILES, extra))
    version = f"{pins.PRIMARY.version}+lepatch.19"
    files = {EXECUTOR: b"# patched executor\n", extra.package_path: b"# patched token\n"}
    python = fake_installed(tmp_path / "env", make_wheel(tmp_path / "w", CORE, version, files))
    site = python.parents[1] / "lib" / PY_DIR / "site-packages"
    rec = {
        "series": {"patches": ["a"]},
        "files": [{"path": p, "sha256_before": "0" * 64, "sha256_after": _hash(d)} for p, d in files.items()],
    }
    (site / f"apache_airflow_core-{version}.dist-info" / wheels.RECORD_NAME).write_text(json.dumps(rec))
    env = wheels.inspect(python)
    assert env.describe().count(CORE) == 1 and "(2 file(s), 1 patch(es))" in env.describe()
    (site / extra.package_path).write_bytes(b"# edited\n")
    assert [extra.package_path in c for c in wheels.inspect(python).changed()] == [True]


def test_an_interpreter_that_cannot_run_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(wheels.WheelsError, match="no such interpreter"):
        wheels.inspect(tmp_path / "nope")
    with pytest.raises(wheels.WheelsError, match="a directory, not an interpreter"):
        wheels.inspect(tmp_path)


# ------------------------------------------------------------- nox -s overlay: the commands


@pytest.mark.parametrize("line", pins.LINES, ids=lambda ln: ln.name)
def test_every_verified_release_gets_one_install_command_for_every_host(line: pins.Line) -> None:
    label = wheels.local_label()
    for core in sorted({line.version, *line.covers}):
        sdk = line.core_sdk[core]
        text = install_commands.commands(core, "/srv/wheels", "/opt/af/bin/python -m pip install")
        install = (
            f"/opt/af/bin/python -m pip install --upgrade --find-links /srv/wheels "
            f"'{CORE}=={core}' '{SDK}=={sdk}'"
        )
        assert text.count(install) == 1 and f"nox -s wheels -- --line {line.name}" in text
        for host, _ in install_commands.HOSTS:
            assert f"   {host}: " in text
        assert f"FROM apache/airflow:{core}" in text and f"{core}+{label} and {sdk}+{label}" in text
        assert f"--force-reinstall --no-deps '{SDK}==={sdk}' '{CORE}==={core}'" in text


def test_a_release_without_verified_wheels_names_the_nearest_one() -> None:
    with pytest.raises(
        wheels.WheelsError, match=r"3\.1\.3: no patched wheels .* nearest verified release is 3\.1\.5"
    ):
        install_commands.commands("3.1.3")
    with pytest.raises(wheels.WheelsError, match="no newer release is verified either"):
        install_commands.commands("9.0.0")


def test_overlay_with_python_reads_the_release_and_names_a_retired_overlay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tools.__main__ import main

    version = pins.PRIMARY.version
    python = fake_installed(tmp_path / "env", make_wheel(tmp_path / "w", CORE, version, {EXECUTOR: b"x\n"}))
    (tmp_path / "env" / install_commands.RETIRED_STATE_DIR).mkdir()
    assert main(["overlay", "--python", str(python)]) == 0
    out = capsys.readouterr().out
    assert f"uv pip install --python {python} --upgrade --find-links dist/wheels '{CORE}=={version}'" in out
    assert f"{CORE} {version}, {SDK} not installed" in out
    assert "left by the retired overlay installer" in out
    assert f"uv pip install --python {python} --reinstall --no-deps '{SDK}===" in out


# ------------------------------------------------------------- e2e --install wheels


def test_e2e_installs_the_wheels_for_the_full_series_only() -> None:
    from tools.measure.e2e import cli
    from tools.shared.errors import ToolError

    assert cli.parse_options([]).install == "files"
    o = cli.parse_options(["--install", "wheels", "--compare-stages", "0,full"])
    assert (o.install, o.compare) == ("wheels", [0, None])
    assert cli.parse_options(["--install", "wheels", "--executor", "celery"]).install == "wheels"
    for extra in (["--executor", "package"], ["--supervisor", "full"], ["--stage", "3"]):
        with pytest.raises(ToolError, match="--install wheels: the full series"):
            cli.parse_options(["--install", "wheels", *extra])


def test_check_install_installs_through_an_operators_own_pip_with_the_lines_constraints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.delivery import wheels_check
    from tools.engine import venvs

    line, label = pins.get_line("3.3"), wheels.local_label()
    reqs = [f"{pins.DISTRIBUTION}=={line.version}", f"{pins.SUPERVISOR.distribution}=={line.sdk_version}"]
    for req in reqs:
        (tmp_path / f"{req.replace('-', '_').replace('==', '-')}+{label}-py3-none-any.whl").touch()
    made: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def make(*a: object, **k: object) -> Path:
        made.append((a, k))
        raise wheels_check.CheckError("stop")

    monkeypatch.setattr(venvs, "make", make)
    with pytest.raises(wheels_check.CheckError, match="stop"):
        wheels_check.check_line(line, tmp_path, sys.executable)
    lock, celery = wheels_check.constraints_for(line)
    reqs += [f"{wheels_check.CELERY}=={celery}"] if celery else []
    args = [*made[0][0][1:], made[0][1]]
    # pip's resolver and --find-links, as an operator runs them
    assert args == [
        sys.executable,
        ["--upgrade", "--find-links", str(tmp_path), *reqs],
        lock,
        {"own_pip": True},
    ]

"""The per-line wheels of ``nox -s package``: built into tmp dirs and read back, no install."""

from __future__ import annotations

import ast
import base64
import datetime as dt
import email.utils
import hashlib
import importlib.util
import sys
import types
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tools.__main__ import main
from tools.delivery import package
from tools.engine import fetch
from tools.engine.series import read_patch, read_series_names
from tools.shared import pins, versions
from tools.shared.layout import DEFAULT

SERIES = len(read_series_names(DEFAULT.series_file)) + package.RECUT_OFFSET

LINES = [line.name for line in pins.LINES]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    try:
        for line in pins.LINES:
            fetch.read_bases(line)
    except Exception as e:  # the pinned wheels are not at hand (no network, no cache)
        pytest.skip(f"pinned wheels unavailable: {e}")
    out = tmp_path_factory.mktemp("dist")
    return {line.name: package.build(line, out) for line in pins.LINES}


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def dist_info(line: pins.Line) -> str:
    return f"airflow_localexecutor_patched-{package.package_version(line)}.dist-info"


def overlay(line: pins.Line, file: pins.UpstreamFile) -> str:
    return (DEFAULT.overlay / line.name / file.package_path).read_text()


def load_module(name: str, source: bytes) -> types.ModuleType:
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("name", LINES)
def test_wheel_name_version_and_layout(wheels, name):
    line = pins.get_line(name)
    n = package.series_length()
    assert n == len(read_series_names(DEFAULT.series_file)) + package.RECUT_OFFSET
    assert wheels[name].name == f"airflow_localexecutor_patched-{line.version}.post{n}-py3-none-any.whl"
    names = set(members(wheels[name]))
    di = dist_info(line)
    assert names == {
        "localexecutor_patched/__init__.py",
        "localexecutor_patched/_verified.py",
        "localexecutor_patched/executor.py",
        "localexecutor_patched/_supervisor.py",
        f"{di}/METADATA",
        f"{di}/WHEEL",
        f"{di}/entry_points.txt",
        f"{di}/top_level.txt",
        f"{di}/RECORD",
    }
    # replaces no file of another distribution: nothing under airflow/ at all
    assert not any(n.startswith("airflow/") for n in names)


def test_build_is_reproducible(wheels, tmp_path):
    line = pins.PRIMARY
    again = package.build(line, tmp_path)
    assert again.read_bytes() == wheels[line.name].read_bytes()
    with zipfile.ZipFile(again) as zf:
        dates = [read_patch(DEFAULT.patches / n).date for n in read_series_names(DEFAULT.series_file)]
        stamp = max(email.utils.parsedate_to_datetime(d) for d in dates).astimezone(dt.timezone.utc)
        assert {i.date_time for i in zf.infolist()} == {stamp.timetuple()[:6]}


def test_source_date_epoch_moves_the_timestamps(tmp_path, monkeypatch, wheels):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # 2026-01-01
    with zipfile.ZipFile(package.build(pins.PRIMARY, tmp_path)) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2026, 1, 1, 0, 0, 0)}


@pytest.mark.parametrize("name", LINES)
def test_record_hashes_every_file(wheels, name):
    files = members(wheels[name])
    record = files[f"{dist_info(pins.get_line(name))}/RECORD"].decode().splitlines()
    listed = {}
    for row in record:
        path, digest, size = row.rsplit(",", 2)
        listed[path] = (digest, size)
    assert set(listed) == set(files)
    for path, data in files.items():
        if path.endswith("/RECORD"):
            assert listed[path] == ("", "")
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert listed[path] == (f"sha256={want}", str(len(data)))


@pytest.mark.parametrize("name", LINES)
def test_metadata_pins_the_verified_releases(wheels, name):
    line = pins.get_line(name)
    files = members(wheels[name])
    meta = Parser().parsestr(files[f"{dist_info(line)}/METADATA"].decode())
    assert meta["Name"] == "airflow-localexecutor-patched"
    assert meta["Version"] == package.package_version(line)
    assert not meta["Name"].startswith("apache-")
    requires = meta.get_all("Requires-Dist")
    core = sorted({line.version, *line.covers}, key=versions.version_key)
    sdk = sorted({line.sdk_version, *line.sdk_covers}, key=versions.version_key)
    want_core = f"=={core[0]}" if len(core) == 1 else f">={core[0]},<={core[-1]}"
    want_sdk = f"=={sdk[0]}" if len(sdk) == 1 else f">={sdk[0]},<={sdk[-1]}"
    assert requires == [f"apache-airflow-core{want_core}", f"apache-airflow-task-sdk{want_sdk}"]
    wheel_meta = files[f"{dist_info(line)}/WHEEL"].decode()
    assert "Root-Is-Purelib: true" in wheel_meta and "Tag: py3-none-any" in wheel_meta
    entry = files[f"{dist_info(line)}/entry_points.txt"].decode()
    assert entry == "[apache_airflow_provider]\nprovider_info = localexecutor_patched:get_provider_info\n"


def test_requirement_ranges():
    assert package.requirement("x", ["3.4.0b2"]) == "x==3.4.0b2"
    assert package.requirement("x", ["3.1.5", "3.1.6", "3.1.7"]) == "x>=3.1.5,<=3.1.7"
    with pytest.raises(package.PackageError, match="not consecutive"):
        package.requirement("x", ["3.1.5", "3.1.7"])


@pytest.mark.parametrize("name", LINES)
def test_executor_is_the_overlay_plus_the_two_insertions(wheels, name):
    line = pins.get_line(name)
    packaged = members(wheels[name])["localexecutor_patched/executor.py"].decode()
    assert package.strip_insertions(packaged) == overlay(line, pins.EXECUTOR)
    tree = ast.parse(packaged)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert "LocalExecutor" in classes
    # the refusal runs before any airflow import; the worker wrapper is the last _run_worker
    first_airflow = next(
        n.lineno
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("airflow")
    )
    refuse = next(
        n.lineno
        for n in tree.body
        if isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and ast.unparse(n.value) == "refuse_unverified()"
    )
    assert refuse < first_airflow
    run_worker = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_run_worker"]
    assert "_supervisor.install()" in ast.unparse(run_worker[-1])


@pytest.mark.parametrize("name", LINES)
def test_supervisor_subclass_carries_exactly_the_overlays_methods(wheels, name):
    line = pins.get_line(name)
    src = members(wheels[name])["localexecutor_patched/_supervisor.py"].decode()
    ours = package.method_sources(src, package.SUBCLASS)
    theirs = package.method_sources(overlay(line, pins.SUPERVISOR))
    base = package.method_sources(fetch.read_bases(line)[pins.SUPERVISOR.repo_path].decode())
    assert set(ours) == {"_service_subprocess", "_check_subprocess_exit"}
    for method, text in ours.items():
        assert text == theirs[method], method  # verbatim from the overlay
        assert text != base[method], method  # and not task-sdk's own
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert [ast.unparse(b) for b in cls.bases] == ["ActivitySubprocess"]


def test_a_supervisor_change_outside_the_methods_is_refused():
    base = "import time\n\nclass WatchedSubprocess:\n    def a(self):\n        return 1\n"
    fixed = base.replace("return 1", "return time.time()")
    assert package.changed_methods(base, fixed) == {"a": "    def a(self):\n        return time.time()\n"}
    with pytest.raises(package.PackageError, match="more than methods"):
        package.changed_methods(base, "X = 1\n" + fixed)
    with pytest.raises(package.PackageError, match="adds or removes"):
        package.changed_methods(base, fixed + "    def b(self):\n        pass\n")
    with pytest.raises(package.PackageError, match="super"):
        package._free_names("    def a(self):\n        return super().a()\n")


@pytest.mark.parametrize("name", LINES)
def test_provider_info_lists_the_executor_and_no_option(wheels, name):
    line = pins.get_line(name)
    init = load_module("lepatch_pkg_init", members(wheels[name])["localexecutor_patched/__init__.py"])
    info = init.get_provider_info()
    assert info["package-name"] == "airflow-localexecutor-patched"
    assert info["executors"] == ["localexecutor_patched.executor.LocalExecutor"]
    # The series reads no [local_executor] option (the prefetch room's two went with it): none to list.
    assert "config" not in info
    assert package.options_read(overlay(line, pins.EXECUTOR)) == set()
    # the runtime schema of the line's own core (jsonschema is not at hand: its required keys)
    schema = package.provider_schema(line)
    assert set(schema["required"]) <= set(info)
    assert schema.get("additionalProperties") is not False  # "versions" is allowed at runtime
    assert ("cli" in info) == ("cli" in schema["properties"])  # 3.2+: an empty cli list
    assert set(info) <= set(schema["properties"]) | {"versions"}


def test_an_option_the_overlay_reads_must_be_documented():
    text = 'x = self.conf.getfloat("local_executor", "prefetch_fraction", fallback=1.0)\n'
    assert package.options_read(text) == {"prefetch_fraction"}
    with pytest.raises(package.PackageError, match=r"reads \[local_executor\] \['prefetch_fraction'\]"):
        package.provider_info(pins.get_line("3.3"), text)


@pytest.fixture
def verified(wheels) -> types.ModuleType:
    return load_module("lepatch_pkg_verified", members(wheels["3.3"])["localexecutor_patched/_verified.py"])


def test_the_verified_releases_pass(verified):
    for core in ("3.3.0", "3.3.1", "3.3.2"):
        assert verified.problem(core, "1.3.2") is None


def test_another_line_is_refused_naming_both_versions_and_the_wheel(verified):
    msg = verified.problem("3.2.2", "1.2.2")
    assert "\n" not in msg
    assert "apache-airflow-core 3.2.2" in msg and "apache-airflow-task-sdk 1.2.2" in msg
    assert f"3.3.2.post{SERIES}" in msg
    assert msg.endswith(f"install airflow_localexecutor_patched-3.2.2.post{SERIES}-py3-none-any.whl instead")


def test_a_task_sdk_it_was_not_verified_with_is_refused(verified):
    msg = verified.problem("3.3.0", "1.3.0")  # core 3.3.0 requires task-sdk 1.3.0: advise the pair pip takes
    assert "`pip install 'apache-airflow-core==3.3.2' 'apache-airflow-task-sdk==1.3.2'`" in msg
    assert msg.endswith("(`nox -s overlay -- --release 3.3.0`), verified with apache-airflow-task-sdk 1.3.0")
    assert "overlay" not in verified.problem("3.3.2", "1.2.2")
    msg = verified.problem("3.2.2", "1.2.0")
    assert f"install airflow_localexecutor_patched-3.2.2.post{SERIES}-py3-none-any.whl instead" in msg
    assert "(verified with apache-airflow-task-sdk 1.2.2)" in msg


def test_an_unknown_release_points_to_the_built_in_executor(verified):
    for core, sdk in (("3.1.2", "1.1.2"), ("3.5.0", "1.5.0"), (None, None)):
        msg = verified.problem(core, sdk)
        assert "\n" not in msg
        assert msg.endswith("set [core] executor = LocalExecutor for the built-in one")


def test_refuse_unverified_raises_airflow_config_exception(verified, monkeypatch):
    class AirflowConfigException(Exception):
        pass

    fake = types.ModuleType("airflow.exceptions")
    fake.AirflowConfigException = AirflowConfigException  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow", types.ModuleType("airflow"))
    monkeypatch.setitem(sys.modules, "airflow.exceptions", fake)
    got = {"apache-airflow-core": "3.2.2", "apache-airflow-task-sdk": "1.2.2"}
    monkeypatch.setattr(verified, "installed", got.get)
    with pytest.raises(AirflowConfigException, match=r"install airflow_localexecutor_patched-3\.2\.2"):
        verified.refuse_unverified()
    got.update({"apache-airflow-core": "3.3.2", "apache-airflow-task-sdk": "1.3.2"})
    verified.refuse_unverified()  # nothing raised


def test_cli_builds_one_line(tmp_path, capsys, wheels):
    assert main(["package", "--line", "3.3", "--out", str(tmp_path)]) == 0
    assert (tmp_path / wheels["3.3"].name).read_bytes() == wheels["3.3"].read_bytes()
    assert "AIRFLOW__CORE__EXECUTOR=localexecutor_patched.executor.LocalExecutor" in capsys.readouterr().out

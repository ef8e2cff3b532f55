"""The e2e venv of another core release a line covers (``--core``): its files, its lock, its wheel."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tools.delivery import package
from tools.engine import apply, fetch, venvs
from tools.measure.e2e.venv import AirflowVenv, stage_sources
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT

L33, L31 = pins.get_line("3.3"), pins.get_line("3.1")
SUP = pins.SUPERVISOR.package_path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cached(version: str, distribution: str = pins.DISTRIBUTION) -> None:
    if not (LAYOUT.cache / fetch.wheel_filename(version, distribution)).is_file():
        pytest.skip(f"{distribution} {version} is not in the wheel cache")


def test_stage_0_of_another_release_is_its_own_executor_and_supervisor() -> None:
    _cached("3.3.0")
    _cached("1.3.0", pins.SUPERVISOR.distribution)
    files, label, _ = stage_sources(L33, 0, "3.3.0")
    assert sha(files[pins.PACKAGE_PATH]) == L33.source_sha256  # covered: the base's file
    assert sha(files[SUP]) == L33.sdk_release_sources["1.3.0"]  # task-sdk 1.3.0's own, not 1.3.2's
    assert label == "stage 0 (base 3.3.0, task-sdk 1.3.0)"


def test_the_full_series_on_another_release_carries_its_task_sdks_own_supervisor_fix() -> None:
    files, label, origin = stage_sources(L33, None, "3.3.0")
    own = LAYOUT.overlay / "3.3" / apply.sdk_release_dir("1.3.0") / SUP
    assert files[SUP] == own.read_bytes() != LAYOUT.overlay_files("3.3")[SUP]
    assert files[pins.PACKAGE_PATH] == LAYOUT.overlay_files("3.3")[pins.PACKAGE_PATH]
    # 3.3.0 ships its own scheduler, base executor and auth manager: the base's patched ones stay out
    assert not {pins.SCHEDULER.package_path, pins.BASE_EXECUTOR.package_path} & set(files)
    assert "task-sdk 1.3.0" in label and origin == "airflow_overlay/3.3/task-sdk-1.3.0"
    # task-sdk 1.1.6 ships 1.1.8's supervisor.py: the line's own overlay
    base_only = {f.package_path for f in pins.UPSTREAM_FILES if f.pinned_on_base_only}
    on_316 = {p: d for p, d in LAYOUT.overlay_files("3.1").items() if p not in base_only}
    assert stage_sources(L31, None, "3.1.6")[0] == on_316
    with pytest.raises(ToolError, match=r"apache-airflow-core 3\.3\.0: stage 2 means nothing there"):
        stage_sources(L33, 2, "3.3.0")


def test_another_release_gets_its_own_venv_and_needs_its_own_release_day_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(venvs, "ensure_release", lambda *a, **k: calls.append((a, k)))
    assert AirflowVenv(L33, tmp_path, print).path == tmp_path / "venv-3.3"
    v = AirflowVenv(L33, tmp_path, print, core="3.3.0")
    assert (v.path, v.core, v.sdk) == (tmp_path / "venv-3.3-core-3.3.0", "3.3.0", "1.3.0")
    v.ensure()
    (args, kwargs) = calls[0]
    assert args == (v.path, "3.3.0", "1.3.0")
    assert kwargs["packages"] == ["apache-airflow[postgres]==3.3.0"]
    assert kwargs["constraints"] == LAYOUT.constraints / "e2e-3.3.0.txt"  # committed: 3.3.0's day
    with pytest.raises(ToolError) as info:
        AirflowVenv(L33, tmp_path, print, core="3.3.1").ensure()
    assert str(info.value) == (
        "constraints/e2e-3.3.1.txt is missing: run `python -m tools e2e-lock --line 3.3 --core 3.3.1` "
        "first (the release day's environment)"
    )
    assert len(calls) == 1


def test_the_wheel_is_installed_with_the_venvs_core_and_task_sdk_named_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = AirflowVenv(L31, tmp_path, print, core="3.1.6")
    bases = {pins.PACKAGE_PATH: b"executor", SUP: b"supervisor"}
    wheel = tmp_path / "dist" / "w.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"wheel")
    uv: list[tuple[str, ...]] = []
    monkeypatch.setattr(AirflowVenv, "_back_to_base", lambda self: bases)
    monkeypatch.setattr(AirflowVenv, "_check", lambda self, b, when: None)
    monkeypatch.setattr(package, "build", lambda line, out: wheel)
    monkeypatch.setattr(
        fetch, "ensure_pin", lambda pin, version, layout: Path(f"/cache/{pin.file.name}-{version}")
    )
    monkeypatch.setattr(venvs, "run_uv", lambda *a, **k: uv.append(a))
    source = v.install_package(tmp_path / "dist")
    airflow = ("/cache/local_executor.py-3.1.6", "/cache/supervisor.py-1.1.6")
    assert uv == [("pip", "install", "--python", str(v.python), "--quiet", *airflow, str(wheel))]
    assert source.sources == bases


def test_the_full_series_goes_in_through_the_patched_wheels_and_a_stage_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.measure.e2e.venv import ExecutorSource

    v = AirflowVenv(L33, tmp_path / "out", print)
    full = {pins.PACKAGE_PATH: b"full executor", SUP: b"full supervisor"}
    bases = {pins.PACKAGE_PATH: b"executor", SUP: b"supervisor"}
    wheels_to: list[Path] = []

    def install_wheels(self: AirflowVenv, dist: Path) -> ExecutorSource:
        wheels_to.append(dist)
        return ExecutorSource("patched wheels", None, full[pins.PACKAGE_PATH], "out/wheels", full)

    monkeypatch.setattr(AirflowVenv, "install_wheels", install_wheels)
    monkeypatch.setattr(AirflowVenv, "_back_to_base", lambda self: bases)
    copied: list[dict[str, bytes]] = []
    monkeypatch.setattr(venvs, "install_sources", lambda python, sources: copied.append(sources))
    monkeypatch.setattr(venvs, "purelib", lambda python: tmp_path / "site")
    how = v.install_executor(ExecutorSource("full series", None, full[pins.PACKAGE_PATH], "overlay", full))
    assert wheels_to == [tmp_path / "out" / "wheels"] and "patched wheels" in how and not copied
    fixed = v.install_supervisor(fixed=True)
    assert fixed.sources == {SUP: full[SUP]} and len(wheels_to) == 2
    # a stage before the final one is in no wheel: its files are copied in
    stage = {pins.PACKAGE_PATH: b"stage 2", SUP: b"supervisor"}
    for path, data in stage.items():
        (tmp_path / "site" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / path).write_bytes(data)
    assert v.install_executor(ExecutorSource("stage 2", 2, b"stage 2", "apply", stage)).startswith("copied")
    assert copied == [stage] and len(wheels_to) == 2


def test_back_to_base_uninstalls_the_package_and_reinstalls_the_pinned_wheels_over_patched_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v, py = AirflowVenv(L33, tmp_path, print), str(tmp_path / "venv-3.3" / "bin" / "python")
    dists = {package.DIST_NAME: "3.3.2.post10", pins.DISTRIBUTION: "3.3.2+lepatch.10", "x": "1.3.2"}
    listing = json.dumps([{"name": d, "version": ver} for d, ver in dists.items()])
    uv: list[tuple[str, ...]] = []

    def fake_uv(*a: str, **k: object) -> str:
        uv.append(a)
        return listing if a[1] == "list" else ""

    monkeypatch.setattr(venvs, "run_uv", fake_uv)
    monkeypatch.setattr(fetch, "ensure_pin", lambda pin, version, layout: Path(f"/{version}.whl"))
    monkeypatch.setattr(AirflowVenv, "sources", lambda self, stage: {"stage": str(stage).encode()})
    monkeypatch.setattr(venvs, "install_sources", lambda python, sources: uv.append(tuple(sources)))
    assert v.patched_wheels() == {pins.DISTRIBUTION: "3.3.2+lepatch.10"}
    assert v._back_to_base() == {"stage": b"0"}
    assert [a for a in uv if a[1:2] != ("list",)] == [
        ("pip", "uninstall", "--python", py, "--quiet", package.DIST_NAME),
        ("pip", "install", "--python", py, "--quiet", "--no-deps", "/3.3.2.whl", "/1.3.2.whl"),
        ("stage",),
    ]
    (tmp_path / "f.py").write_bytes(b"other")
    monkeypatch.setattr(venvs, "purelib", lambda python: tmp_path)
    with pytest.raises(
        ToolError, match=rf"f\.py: sha256 {sha(b'other')[:12]} after x, expected {sha(b'x')[:12]}$"
    ):
        v._check({"f.py": b"x"}, "after x")

"""Overlay install/status/restore: against a fake environment (fast), and a real pinned venv (uv)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.delivery import overlay_install as oi
from tools.shared import pins

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_airflow import base_source

LINE = pins.PRIMARY
PY_DIR = f"python{sys.version_info.major}.{sys.version_info.minor}"


def _fake_dist(site: Path, file: pins.UpstreamFile, version: str, source: bytes) -> Path:
    dist = site / f"{file.distribution.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {file.distribution}\nVersion: {version}\n")
    target = site / file.package_path
    target.parent.mkdir(parents=True)
    target.write_bytes(source)
    return target


def fake_env(
    root: Path, version: str, source: bytes, sdk: tuple[str, bytes] | None = None
) -> tuple[Path, Path]:
    """A venv with a stand-in apache-airflow-core (metadata and local_executor.py only), and
    with ``sdk`` = (version, supervisor.py) a stand-in apache-airflow-task-sdk as well."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / PY_DIR / "site-packages"
    target = _fake_dist(site, pins.EXECUTOR, version, source)
    if sdk is not None:
        _fake_dist(site, pins.SUPERVISOR, *sdk)
    return root / "bin" / "python", target


@pytest.fixture(scope="module")
def base() -> bytes:
    src = base_source(LINE)
    if src is None:
        pytest.skip(f"no {LINE.wheel_name} at hand")
    return src


@pytest.fixture
def overlay_dir(tmp_path: Path, base: bytes) -> Path:
    d = tmp_path / "overlay"
    f = d / LINE.name / pins.PACKAGE_PATH
    f.parent.mkdir(parents=True)
    f.write_bytes(base + b"\n# lepatch test overlay\n")
    return d


def smoke_script(tmp_path: Path, ok: bool) -> Path:
    script = tmp_path / ("smoke_ok.py" if ok else "smoke_bad.py")
    script.write_text(
        "import os, sys\n"
        "assert sys.argv[1:] == ['--smoke'] and os.environ['AIRFLOW_HOME']\n"
        f"sys.exit({0 if ok else 1})\n"
    )
    return script


def make(
    python: Path, overlay_dir: Path, tmp_path: Path, ok: bool = True, out: io.StringIO | None = None
) -> oi.OverlayInstaller:
    return oi.OverlayInstaller(
        python, overlay_dir=overlay_dir, smoke_script=smoke_script(tmp_path, ok), out=out or io.StringIO()
    )


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_install_status_restore_roundtrip(tmp_path: Path, base: bytes, overlay_dir: Path) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.1", base)  # a covered patch release
    pyc = target.parent / "__pycache__" / f"local_executor.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"stale bytecode")
    out = io.StringIO()
    inst = make(python, overlay_dir, tmp_path, out=out)
    assert inst.status().state is oi.OverlayState.PRISTINE

    st = inst.install()
    overlay = (overlay_dir / LINE.name / pins.PACKAGE_PATH).read_bytes()
    assert st.state is oi.OverlayState.INSTALLED
    assert target.read_bytes() == overlay
    assert not pyc.exists() or pyc.read_bytes() != b"stale bytecode"
    state_dir = tmp_path / "env" / oi.STATE_DIR_NAME
    assert (state_dir / oi.BACKUP_NAME).read_bytes() == base
    record = json.loads((state_dir / oi.RECORD_NAME).read_text())
    assert record["state"] == "installed" and record["line"] == "3.3" and record["version"] == "3.3.1"
    assert [f["file"] for f in record["files"]] == ["local_executor.py"]  # no task-sdk in this env
    assert record["files"][0]["original_sha256"] == LINE.source_sha256

    before = snapshot(tmp_path / "env")
    inst.install()  # again: a no-op
    assert snapshot(tmp_path / "env") == before
    assert "already installed" in out.getvalue()

    st = inst.restore()
    assert st.state is oi.OverlayState.PRISTINE
    assert target.read_bytes() == base
    assert not state_dir.exists()


def test_refuses_unpinned_version(tmp_path: Path, base: bytes, overlay_dir: Path) -> None:
    python, _ = fake_env(tmp_path / "env", "3.0.6", base)
    before = snapshot(tmp_path / "env")
    with pytest.raises(oi.OverlayError, match=r"3\.0\.6 is on no pinned release line; upgrade to 3\.1\.5,"):
        make(python, overlay_dir, tmp_path).install()
    assert snapshot(tmp_path / "env") == before


def test_a_release_with_another_file_is_refused_naming_the_upgrade(
    tmp_path: Path, base: bytes, overlay_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3.1.3 ships another local_executor.py than the 3.1 line's base: the nearest served release is named."""
    python, _ = fake_env(tmp_path / "env", "3.1.3", b"# 3.1.3's own local_executor.py\n")
    before = snapshot(tmp_path / "env")
    assert oi.main(["install", "--python", str(python), "--overlay-dir", str(overlay_dir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        "apache-airflow-core 3.1.3 ships a different local_executor.py than 3.1.8 (the 3.1 line's base;"
        in err
    )
    assert (
        "upgrade to 3.1.5, the nearest verified release (same line; verified: 3.1.5, 3.1.6, 3.1.7, 3.1.8)"
        in err
    )
    assert snapshot(tmp_path / "env") == before


L31 = pins.get_line("3.1")


@pytest.mark.parametrize(
    ("version", "source", "expected"),
    [
        (
            "3.1.4rc2",
            "other",
            r"3\.1\.4rc2 ships a different local_executor\.py than 3\.1\.8 .* upgrade to 3\.1\.5,",
        ),
        (
            "3.1.2",
            L31.source_sha256,
            r"same local_executor\.py as 3\.1\.8 .* not recorded as verified .* upgrade to 3\.1\.5,",
        ),
        ("3.1.9", L31.source_sha256, r"3\.1\.9 ships the same .* `python -m tools pins --discover --write`"),
        (
            "3.1.9",
            "other",
            r"3\.1\.9 is newer than 3\.1\.8 .*`python -m tools pins --bump 3\.1 3\.1\.9`.* stay on 3\.1\.8",
        ),
        ("3.4.0b1", "other", r"upgrade to 3\.4\.0b2, the nearest verified release \(same line"),
        ("9.0.0", "other", r"9\.0\.0 is newer than every pinned line"),
        ("3.1", "other", r"3\.1 is not a release any overlay is verified for"),
    ],
)
def test_unpinned_refusal_names_the_way_forward(version: str, source: str, expected: str) -> None:
    message = oi.unpinned_refusal(version, source)
    assert "\n" not in message and message.endswith("refusing, nothing changed")
    assert re.search(expected, message), message


def test_refuses_file_patched_by_someone_else(tmp_path: Path, base: bytes, overlay_dir: Path) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base + b"# local hotfix\n")
    before = snapshot(tmp_path / "env")
    inst = make(python, overlay_dir, tmp_path)
    assert inst.status().state is oi.OverlayState.FOREIGN
    with pytest.raises(
        oi.OverlayError, match=r"not byte-identical to the pinned apache-airflow-core 3\.3\.2 base"
    ) as exc:
        inst.install()
    assert str(target) in str(exc.value) and "\n" not in str(exc.value)
    assert snapshot(tmp_path / "env") == before


def test_refuses_when_overlay_missing(tmp_path: Path, base: bytes) -> None:
    python, _ = fake_env(tmp_path / "env", "3.3.2", base)
    before = snapshot(tmp_path / "env")
    with pytest.raises(oi.OverlayError, match=r"no overlay for line 3\.3"):
        make(python, tmp_path / "nothing", tmp_path).install()
    assert snapshot(tmp_path / "env") == before


def test_failed_smoke_puts_the_original_back(tmp_path: Path, base: bytes, overlay_dir: Path) -> None:
    python, _ = fake_env(tmp_path / "env", "3.3.2", base)
    before = snapshot(tmp_path / "env")
    with pytest.raises(oi.OverlayError, match=r"failed the smoke dispatch .* original files were put back"):
        make(python, overlay_dir, tmp_path, ok=False).install()
    assert snapshot(tmp_path / "env") == before


def test_overlay_that_does_not_compile_is_rolled_back(tmp_path: Path, base: bytes) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base)
    bad = tmp_path / "bad" / LINE.name / pins.PACKAGE_PATH
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"def broken(:\n")
    with pytest.raises(oi.OverlayError, match="does not compile"):
        make(python, tmp_path / "bad", tmp_path).install()
    assert target.read_bytes() == base


def test_status_sees_changes_and_restore_needs_force(tmp_path: Path, base: bytes, overlay_dir: Path) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base)
    inst = make(python, overlay_dir, tmp_path)
    inst.install()
    target.write_bytes(target.read_bytes() + b"# edited after install\n")
    assert inst.status().state is oi.OverlayState.MODIFIED
    with pytest.raises(oi.OverlayError, match=r"changed since .* `restore --force`"):
        inst.restore()
    assert b"edited after install" in target.read_bytes()
    out = io.StringIO()
    inst._out = out
    inst.restore(force=True)
    assert target.read_bytes() == base
    (kept,) = (tmp_path / "env" / oi.STATE_DIR_NAME / oi.KEPT_DIR_NAME).iterdir()
    assert b"edited after install" in kept.read_bytes()
    assert f"kept as {kept}" in out.getvalue()


def test_restore_force_keeps_the_operators_edit_and_says_where(
    tmp_path: Path, base: bytes, overlay_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base)
    args = ["--python", str(python), "--overlay-dir", str(overlay_dir)]
    make(python, overlay_dir, tmp_path).install()
    edited = target.read_bytes() + b"# the operator's hotfix\n"
    target.write_bytes(edited)
    # install and restore each say the one way out (restore --force), once, on one line
    assert oi.main(["install", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count(str(target)) == 1 and "`restore --force`" in err
    assert oi.main(["restore", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`restore --force`" in err and "then install" not in err
    assert target.read_bytes() == edited
    assert oi.main(["restore", "--force", *args]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    kept = list((tmp_path / "env" / oi.STATE_DIR_NAME / oi.KEPT_DIR_NAME).iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == edited and f"kept as {kept[0]}" in out
    assert target.read_bytes() == base
    assert oi.main(["status", *args]) == 0  # pristine again; the kept file stays
    assert kept[0].is_file()


def test_interrupted_install_is_visible_and_restorable(
    tmp_path: Path, base: bytes, overlay_dir: Path
) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base)
    inst = make(python, overlay_dir, tmp_path)
    inst.install()
    record_path = tmp_path / "env" / oi.STATE_DIR_NAME / oi.RECORD_NAME
    record = json.loads(record_path.read_text())
    record["state"] = "installing"  # as if killed between the swap and the smoke result
    record_path.write_text(json.dumps(record))
    assert inst.status().state is oi.OverlayState.INSTALLING
    with pytest.raises(oi.OverlayError, match="interrupted"):
        inst.install()
    inst.restore()
    assert target.read_bytes() == base


def test_cli_status_and_exit_codes(
    tmp_path: Path, base: bytes, overlay_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base)
    args = ["--python", str(python), "--overlay-dir", str(overlay_dir)]
    assert oi.main(["status", *args]) == 0
    assert "are the pinned 3.3 bases" in capsys.readouterr().out
    target.write_bytes(b"# someone else's\n")
    assert oi.main(["status", "--json", *args]) == 3
    assert json.loads(capsys.readouterr().out)["state"] == "foreign"
    assert oi.main(["install", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert oi.main(["restore", *args]) == 1
    assert "nothing to restore" in capsys.readouterr().err


def test_cli_refuses_a_missing_interpreter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert oi.main(["status", "--python", str(tmp_path / "nope" / "python")]) == 1
    assert "no such interpreter" in capsys.readouterr().err


# ---------------------------------------------------------------- both upstream files

SDK_BASE = b"# stand-in for task-sdk's supervisor.py\n"


@pytest.fixture
def two_file_line(monkeypatch: pytest.MonkeyPatch) -> pins.Line:
    """The primary line with a task-sdk pin whose supervisor.py is SDK_BASE."""
    line = dataclasses.replace(
        LINE,
        sdk_version="1.3.2",
        sdk_wheel_sha256="0" * 64,
        sdk_source_sha256=oi.sha256(SDK_BASE),
        sdk_covers={"1.3.1": "1" * 64},
        sdk_releases={},
        sdk_release_sources={},
    )
    monkeypatch.setattr(pins, "LINES", (line, *pins.LINES[1:]))
    return line


@pytest.fixture
def two_file_overlay(overlay_dir: Path) -> Path:
    f = overlay_dir / LINE.name / pins.SUPERVISOR.package_path
    f.parent.mkdir(parents=True)
    f.write_bytes(SDK_BASE + b"# lepatch test overlay\n")
    return overlay_dir


def test_both_files_install_and_restore_together(
    tmp_path: Path, base: bytes, two_file_line: pins.Line, two_file_overlay: Path
) -> None:
    python, target = fake_env(tmp_path / "env", "3.3.2", base, sdk=("1.3.1", SDK_BASE))
    supervisor = target.parents[2] / pins.SUPERVISOR.package_path
    inst = make(python, two_file_overlay, tmp_path)
    assert inst.status().state is oi.OverlayState.PRISTINE
    inst.install()
    assert (
        supervisor.read_bytes() == (two_file_overlay / LINE.name / pins.SUPERVISOR.package_path).read_bytes()
    )
    record = json.loads((tmp_path / "env" / oi.STATE_DIR_NAME / oi.RECORD_NAME).read_text())
    assert [(f["file"], f["version"]) for f in record["files"]] == [
        ("local_executor.py", "3.3.2"),
        ("supervisor.py", "1.3.1"),
    ]
    supervisor.write_bytes(b"# edited\n")
    assert inst.status().state is oi.OverlayState.MODIFIED
    with pytest.raises(oi.OverlayError, match=r"supervisor\.py changed since"):
        inst.restore()
    inst.restore(force=True)
    assert (target.read_bytes(), supervisor.read_bytes()) == (base, SDK_BASE)


@pytest.mark.parametrize(
    ("sdk_version", "source", "expected"),
    [
        (
            "1.3.0",
            SDK_BASE,
            r"apache-airflow-task-sdk 1\.3\.0 is not a release the 3\.3 overlay is verified "
            r"with \(verified: 1\.3\.1, 1\.3\.2\): `uv pip install --python \S+ "
            r"'apache-airflow-core==3\.3\.2' 'apache-airflow-task-sdk==1\.3\.2'` \(the pair "
            r"apache-airflow-core 3\.3\.2 requires\), then install again; refusing, nothing changed",
        ),
        (
            "1.3.2",
            b"# patched by hand\n",
            r"supervisor\.py is not byte-identical to the pinned "
            r"apache-airflow-task-sdk 1\.3\.2 base",
        ),
    ],
)
def test_an_unverified_supervisor_refuses_the_whole_install(
    tmp_path: Path,
    base: bytes,
    two_file_line: pins.Line,
    two_file_overlay: Path,
    sdk_version: str,
    source: bytes,
    expected: str,
) -> None:
    python, _ = fake_env(tmp_path / "env", "3.3.2", base, sdk=(sdk_version, source))
    before = snapshot(tmp_path / "env")
    with pytest.raises(oi.OverlayError, match=expected) as exc:
        make(python, two_file_overlay, tmp_path).install()
    assert "\n" not in str(exc.value)
    assert snapshot(tmp_path / "env") == before


def test_cli_names_the_interpreter_when_given_the_venv_directory(
    tmp_path: Path, base: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """--python ENV (the venv, not ENV/bin/python) was Errno 13: now one line naming the interpreter."""
    python, _ = fake_env(tmp_path / "env", "3.3.2", base)
    assert oi.main(["status", "--python", str(tmp_path / "env")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'env'}: a directory, not an interpreter; pass --python {python}\n"
    assert "Errno" not in err


# ---------------------------------------------------------------- a real pinned environment

UV = shutil.which("uv")


@pytest.mark.skipif(UV is None, reason="uv is needed to build a real apache-airflow-core venv")
def test_real_venv_install_smoke_restore(tmp_path: Path, base: bytes) -> None:
    """A real apache-airflow-core and task-sdk as the 3.3 line pins them, the real smoke dispatch.

    (3.3.0 and 3.3.1, covered for local_executor.py, require task-sdk 1.3.0 and 1.3.1 exactly,
    whose supervisor.py is another file: the overlay refuses those.)"""
    assert UV is not None  # the skipif above
    venv = tmp_path / "airflow-env"
    subprocess.run([UV, "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    wheel = Path(os.environ.get("LEPATCH_CACHE", "build/cache")) / LINE.wheel_name
    requirement = str(wheel) if wheel.is_file() else f"apache-airflow-core=={LINE.version}"
    python = venv / "bin" / "python"
    # The task-sdk the 3.3 line pins: the overlay patches its supervisor.py too.
    sdk = f"{pins.SUPERVISOR.distribution}=={LINE.sdk_version}"
    proc = subprocess.run(
        [UV, "pip", "install", "-q", "--python", str(python), requirement, sdk],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot install apache-airflow-core {LINE.version}: {proc.stderr.strip()[-200:]}")
    real = oi.OVERLAY_DIR / LINE.name / pins.PACKAGE_PATH
    overlay_dir = oi.OVERLAY_DIR
    if not real.is_file():  # before the series exists: the base plus a marker line
        overlay_dir = tmp_path / "overlay"
        f = overlay_dir / LINE.name / pins.PACKAGE_PATH
        f.parent.mkdir(parents=True)
        f.write_bytes(base + b"\n# lepatch test overlay\n")
    out = io.StringIO()
    inst = oi.OverlayInstaller(python, overlay_dir=overlay_dir, out=out)
    env = inst.inspect()
    assert env.version == LINE.version
    assert env.target.read_bytes() == base

    st = inst.install()
    assert st.state is oi.OverlayState.INSTALLED
    assert "smoke dispatch passed" in out.getvalue()
    assert env.target.read_bytes() == (overlay_dir / LINE.name / pins.PACKAGE_PATH).read_bytes()
    supervisor = env.files[1].target
    sdk_overlay = overlay_dir / LINE.name / pins.SUPERVISOR.package_path
    if sdk_overlay.is_file():
        assert supervisor.read_bytes() == sdk_overlay.read_bytes()

    inst.restore()
    assert env.target.read_bytes() == base
    assert oi.sha256(supervisor.read_bytes()) == LINE.sdk_source_sha256
    assert inst.status().state is oi.OverlayState.PRISTINE


# ---------------------------------------------------------------- the API server's token check

AUTH_BASE = b"# stand-in for the API server's base_auth_manager.py\n"


@pytest.fixture
def auth_overlay(overlay_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The primary line pinning AUTH_BASE as its base release's base_auth_manager.py, patched."""
    line = dataclasses.replace(LINE, auth_source_sha256=oi.sha256(AUTH_BASE))
    monkeypatch.setattr(pins, "LINES", (line, *pins.LINES[1:]))
    f = overlay_dir / LINE.name / pins.AUTH_MANAGER.package_path
    f.parent.mkdir(parents=True)
    f.write_bytes(AUTH_BASE + b"# lepatch test overlay\n")
    return overlay_dir


def _with_auth(tmp_path: Path, version: str, base: bytes) -> tuple[Path, Path, Path]:
    python, target = fake_env(tmp_path / "env", version, base)
    auth = target.parents[2] / pins.AUTH_MANAGER.package_path
    auth.parent.mkdir(parents=True)
    auth.write_bytes(AUTH_BASE)
    return python, target, auth


def test_the_api_servers_file_installs_with_the_executor_on_the_base_release_only(
    tmp_path: Path, base: bytes, auth_overlay: Path
) -> None:
    patched = (auth_overlay / LINE.name / pins.AUTH_MANAGER.package_path).read_bytes()
    python, _, auth = _with_auth(tmp_path / "base", LINE.version, base)
    make(python, auth_overlay, tmp_path).install()
    assert auth.read_bytes() == patched
    record = json.loads((tmp_path / "base" / "env" / oi.STATE_DIR_NAME / oi.RECORD_NAME).read_text())
    assert [f["file"] for f in record["files"]] == ["local_executor.py", "base_auth_manager.py"]
    make(python, auth_overlay, tmp_path).restore()
    assert auth.read_bytes() == AUTH_BASE

    # 3.3.1 ships another base_auth_manager.py than the base's: it is left as released.
    python, target, auth = _with_auth(tmp_path / "covered", "3.3.1", base)
    make(python, auth_overlay, tmp_path).install()
    assert target.read_bytes() != base and auth.read_bytes() == AUTH_BASE


def test_only_api_server_installs_the_token_check_alone(
    tmp_path: Path, base: bytes, auth_overlay: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python, target, auth = _with_auth(tmp_path, LINE.version, base)
    args = ["install", "--only", "api-server", "--python", str(python), "--overlay-dir", str(auth_overlay)]
    assert oi.main(args) == 0, capsys.readouterr().err
    assert target.read_bytes() == base
    assert auth.read_bytes() == (auth_overlay / LINE.name / pins.AUTH_MANAGER.package_path).read_bytes()


def test_a_file_pinned_on_base_only_may_be_missing_from_the_installed_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A core release without base_auth_manager.py is inspected as one without it; a file whose
    pin carries no ``pinned_on_base_only`` missing from its installed distribution is refused."""
    assert [f for f in pins.UPSTREAM_FILES if f.pinned_on_base_only] == [
        pins.AUTH_MANAGER,
        pins.SCHEDULER,
        pins.BASE_EXECUTOR,
    ]
    python, _ = fake_env(tmp_path / "env", LINE.version, b"# stand-in local_executor.py\n")
    inst = make(python, tmp_path / "overlay", tmp_path)
    auth = next(i for i in inst.inspect().files if i.file is pins.AUTH_MANAGER)
    assert auth.version is None
    every_release = dataclasses.replace(pins.AUTH_MANAGER, pinned_on_base_only=False)
    monkeypatch.setattr(pins, "UPSTREAM_FILES", (pins.EXECUTOR, pins.SUPERVISOR, every_release))
    with pytest.raises(
        oi.OverlayError, match=r"apache-airflow-core \S+ is installed but this file is missing"
    ):
        inst.inspect()

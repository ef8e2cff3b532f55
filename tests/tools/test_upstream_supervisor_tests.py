"""Upstream's test_supervisor.py runner: the pinned sdist, its tests/ tree, the verdict (no network)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tools.delivery import upstream_supervisor_tests as ust
from tools.delivery.upstream_tests import Outcome
from tools.engine import fetch
from tools.shared import pins
from tools.shared.layout import Layout


def make_sdist(path: Path, version: str, members: dict[str, bytes]) -> Path:
    root = f"apache_airflow_task_sdk-{version}"
    with tarfile.open(path, "w:gz" if path.suffix == ".gz" else "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_the_sdist_in_the_cache_is_refused_unless_its_sha256_is_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(root=tmp_path)
    monkeypatch.setenv("LEPATCH_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "cache" / "sdists" / ust.sdist_name("9.9.9")
    target.parent.mkdir(parents=True)
    make_sdist(target, "9.9.9", {f"tests/{ust.TEST_FILE}": b"def test_x(): pass\n"})
    monkeypatch.setattr(pins, "SDK_SDIST_SHA256", {"9.9.9": fetch.sha256_file(target)})
    assert ust.ensure_sdist("9.9.9", layout) == target
    monkeypatch.setattr(pins, "SDK_SDIST_SHA256", {"9.9.9": "0" * 64})
    with pytest.raises(ust.SupervisorTestsError, match=r"refusing apache_airflow_task_sdk-9\.9\.9\.tar\.gz"):
        ust.ensure_sdist("9.9.9", layout)
    assert not target.exists()  # a file no pin vouches for does not stay in the cache
    with pytest.raises(ust.SupervisorTestsError, match=r"task-sdk 8\.0\.0: no sdist sha256 pinned"):
        ust.ensure_sdist("8.0.0", layout)


def test_only_the_sdists_tests_tree_is_extracted(tmp_path: Path) -> None:
    sdist = make_sdist(
        tmp_path / "s.tar.gz",
        "9.9.9",
        {
            f"tests/{ust.TEST_FILE}": b"def test_x(): pass\n",
            "tests/conftest.py": b"",
            "src/airflow/sdk/execution_time/supervisor.py": b"# upstream\n",
        },
    )
    tests = ust.extract_tests(sdist, tmp_path / "out")
    assert sorted(p.relative_to(tests).as_posix() for p in tests.rglob("*") if p.is_file()) == [
        "conftest.py",
        ust.TEST_FILE,
    ]
    assert not (tmp_path / "out" / "src").exists()
    bare = make_sdist(tmp_path / "bare.tar.gz", "9.9.9", {"tests/conftest.py": b""})
    with pytest.raises(ust.SupervisorTestsError, match=f"has no tests/{ust.TEST_FILE}"):
        ust.extract_tests(bare, tmp_path / "out2")


@pytest.mark.parametrize("data_filter", [True, False], ids=["filter", "no-filter"])
def test_a_member_leaving_the_tests_tree_is_refused_with_or_without_tarfiles_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_filter: bool
) -> None:
    if not data_filter:  # Debian 12's 3.11.2 has no tarfile.data_filter (nor extractall's filter=)
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good = {f"tests/{ust.TEST_FILE}": b"def test_x(): pass\n"}
    tests = ust.extract_tests(make_sdist(tmp_path / "ok.tar.gz", "9.9.9", good), tmp_path / "ok")
    assert (tests / ust.TEST_FILE).read_bytes() == b"def test_x(): pass\n"
    evil = make_sdist(tmp_path / "evil.tar.gz", "9.9.9", {**good, "tests/../../escaped.py": b"x"})
    with pytest.raises(ust.SupervisorTestsError, match="refusing member"):
        ust.extract_tests(evil, tmp_path / "evil")
    link = make_sdist(tmp_path / "link.tar", "9.9.9", good)  # uncompressed: "a" appends to it
    with tarfile.open(link, "a") as tf:
        sym = tarfile.TarInfo("apache_airflow_task_sdk-9.9.9/tests/etc")
        sym.type, sym.linkname = tarfile.SYMTYPE, "/etc"
        tf.addfile(sym)
    with pytest.raises(ust.SupervisorTestsError, match="refusing member 'tests/etc'"):
        ust.extract_tests(link, tmp_path / "linked")
    assert not (tmp_path / "escaped.py").exists()


def test_every_covered_release_has_a_pinned_sdist_and_others_are_refused() -> None:
    for line in pins.LINES:
        for version in line.sdk_versions:
            assert version in pins.SDK_SDIST_SHA256
            assert ust.line_of(version) is line
    with pytest.raises(
        ust.SupervisorTestsError, match=r"task-sdk 1\.0\.0: no line's overlay has its supervisor"
    ):
        ust.line_of("1.0.0")


def test_a_test_failing_only_on_the_patched_file_is_named() -> None:
    unpatched = Outcome("x", {"passed": 2, "failed": 1}, ["t.py::test_a"], 1)
    patched = Outcome("x", {"passed": 2, "failed": 1}, ["t.py::test_b"], 1)
    assert ust.changed({"unpatched": unpatched, "patched": patched}) == (["t.py::test_b"], ["t.py::test_a"])

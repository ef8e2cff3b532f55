"""pins --discover and --bump against a fake index: wheels built in tmp_path, no network."""

from __future__ import annotations

import dataclasses
import io
import sys
import types
import zipfile
from pathlib import Path

import pytest

from tools import __main__ as cli
from tools.engine import fetch, releases
from tools.shared import pins, versions
from tools.shared.errors import ToolError
from tools.shared.layout import Layout
from tools.shared.pins import Line

BASE_91 = b"# the 9.1 line's local_executor.py\n"
OLD_91 = b"# 9.1.0 shipped another local_executor.py\n"
BASE_92 = b"# 9.2.0b2's local_executor.py\n"


class FakeIndex:
    """An index of wheels built in a directory; it counts what was downloaded."""

    def __init__(self, root: Path, sources: dict[str, bytes]) -> None:
        self.root = root
        self.wheels = {v: make_wheel(root, v, src) for v, src in sources.items()}
        self.downloads: list[str] = []

    def versions(self) -> list[str]:
        return sorted(self.wheels, key=versions.version_key, reverse=True)

    def download(self, version: str, dest: Path) -> None:
        self.downloads.append(version)
        (dest / fetch.wheel_filename(version)).write_bytes(self.wheels[version].read_bytes())

    def sha(self, version: str) -> str:
        return fetch.sha256_file(self.wheels[version])


def make_wheel(root: Path, version: str, source: bytes) -> Path:
    path = root / "index" / fetch.wheel_filename(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(pins.PACKAGE_PATH, source)
        zf.writestr(f"apache_airflow_core-{version}.dist-info/METADATA", f"Version: {version}\n")
    return path


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    monkeypatch.delenv("LEPATCH_CACHE", raising=False)
    return Layout(root=tmp_path / "repo")


@pytest.fixture
def index(tmp_path: Path) -> FakeIndex:
    return FakeIndex(
        tmp_path,
        {
            "9.1.0": OLD_91,
            "9.1.1": BASE_91,
            "9.1.2": BASE_91,
            "9.1.3rc1": BASE_91,
            "9.1.3": BASE_91,
            "9.2.0b1": BASE_92,
            "9.2.0b2": BASE_92,
            "9.3.0": b"# a line nobody pinned\n",
        },
    )


@pytest.fixture
def lines(index: FakeIndex) -> tuple[Line, ...]:
    return (
        Line(
            name="9.1",
            version="9.1.3",
            wheel_sha256=index.sha("9.1.3"),
            source_sha256=fetch.sha256_bytes(BASE_91),
            branch="v9-1-test",
            covers={"9.1.2": index.sha("9.1.2")},
        ),
        Line(
            name="9.2",
            version="9.2.0b2",
            wheel_sha256=index.sha("9.2.0b2"),
            source_sha256=fetch.sha256_bytes(BASE_92),
            branch="main",
            prerelease=True,
        ),
    )


@pytest.fixture
def pins_file(tmp_path: Path, lines: tuple[Line, ...]) -> Path:
    """A copy of tools/shared/pins.py holding the fake lines."""
    path = tmp_path / "pins.py"
    path.write_text(releases.pins_text(releases.PINS_FILE.read_text(), lines))
    return path


def load_lines(path: Path) -> list[dict[str, object]]:
    module = types.ModuleType("pins_under_test")
    sys.modules[module.__name__] = module
    try:
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return [dataclasses.asdict(ln) for ln in module.LINES]


# ------------------------------------------------------------------ versions and the file


def test_version_order_is_pep440_for_the_forms_on_the_index() -> None:
    ordered = ["3.0.0rc1", "3.0.0rc1.post4", "3.0.0", "3.4.0b1", "3.4.0b2", "3.4.0rc1", "3.4.0", "3.4.1"]
    assert sorted(reversed(ordered), key=versions.version_key) == ordered
    assert versions.is_prerelease("3.4.0b2") and not versions.is_prerelease("3.4.0")
    assert releases.line_of("3.1.3") == "3.1"
    with pytest.raises(ToolError, match=r"3\.4\.dev0: not a release version"):
        versions.version_key("3.4.dev0")


def test_rendering_the_pinned_lines_reproduces_tools_pins_byte_for_byte() -> None:
    text = releases.PINS_FILE.read_text()
    assert releases.pins_text(text, pins.LINES) == text


def test_nearest_verified_is_the_smallest_served_upgrade(lines: tuple[Line, ...]) -> None:
    assert releases.nearest_verified("9.1.0", lines) == (lines[0], "9.1.2")
    assert releases.nearest_verified("9.1.2rc1", lines) == (lines[0], "9.1.2")
    assert releases.nearest_verified("8.0.0", lines) == (lines[0], "9.1.2")
    # Above its own line's base: the next line's oldest verified release, if any.
    assert releases.nearest_verified("9.1.4", lines) == (lines[1], "9.2.0b2")
    assert releases.nearest_verified("9.9.0", lines) is None


# ------------------------------------------------------------------ discover


def test_discover_sorts_releases_and_write_records_the_identical_ones(
    index: FakeIndex, lines: tuple[Line, ...], pins_file: Path, layout: Layout
) -> None:
    out = io.StringIO()
    assert (
        releases.run_discover(write=True, index=index, lines=lines, path=pins_file, layout=layout, out=out)
        == 0
    )
    assert releases.run_discover(write=True, index=index, lines=lines, path=pins_file, layout=layout) == 0
    text = out.getvalue()
    rows = {line.split()[1]: line.split() for line in text.splitlines()[1:] if line.startswith("9.")}
    assert rows["9.1.3"][4] == "base" and rows["9.1.2"][-1] == "pinned"
    assert " ".join(rows["9.1.1"][4:]) == "same as base new"
    assert rows["9.1.0"][4] == "DIFFERS" and rows["9.1.0"][3] == fetch.sha256_bytes(OLD_91)[:12]
    assert rows["9.1.3rc1"][4:6] == ["pre-release,", "skipped"]
    # A pre-release line's own pre-releases are judged like any release.
    assert " ".join(rows["9.2.0b1"][4:]) == "same as base new"
    assert "9.3.0" not in rows
    assert "refused with a way forward: 9.1.0" in text
    assert "9.1.3rc1" not in index.downloads  # a skipped release is never fetched
    written = load_lines(pins_file)
    assert written[0]["covers"] == {"9.1.1": index.sha("9.1.1"), "9.1.2": index.sha("9.1.2")}
    assert written[1]["covers"] == {"9.2.0b1": index.sha("9.2.0b1")}
    assert [w["version"] for w in written] == ["9.1.3", "9.2.0b2"]


def test_discover_without_write_changes_nothing(
    index: FakeIndex, lines: tuple[Line, ...], pins_file: Path, layout: Layout
) -> None:
    before = pins_file.read_bytes()
    out = io.StringIO()
    releases.run_discover(write=False, index=index, lines=lines, path=pins_file, layout=layout, out=out)
    assert "not covered yet: 9.1.1, 9.2.0b1 (--write records them" in out.getvalue()
    assert pins_file.read_bytes() == before


def test_discover_refuses_a_pinned_release_whose_wheel_changed(
    index: FakeIndex, lines: tuple[Line, ...], pins_file: Path, layout: Layout
) -> None:
    make_wheel(index.root, "9.1.2", BASE_91 + b"# rebuilt\n")
    before = pins_file.read_bytes()
    with pytest.raises(ToolError, match=r"refusing apache-airflow-core 9\.1\.2: wheel sha256 is") as info:
        releases.run_discover(write=True, index=index, lines=lines, path=pins_file, layout=layout)
    assert "\n" not in str(info.value)
    assert pins_file.read_bytes() == before


def test_a_discovered_wheel_is_adopted_by_the_cache_once_pinned(
    index: FakeIndex, lines: tuple[Line, ...], pins_file: Path, layout: Layout
) -> None:
    releases.run_discover(
        write=True, index=index, lines=lines, path=pins_file, layout=layout, out=io.StringIO()
    )
    fetched = len(index.downloads)
    wheel = fetch.ensure_verified("9.1.1", index.sha("9.1.1"), layout, index.download)
    assert wheel == layout.cache / fetch.wheel_filename("9.1.1")
    assert len(index.downloads) == fetched
    assert not fetch.unpinned_path("9.1.1", layout).exists()


# ------------------------------------------------------------------ bump


def test_bump_to_a_final_release_with_the_same_file(
    index: FakeIndex, lines: tuple[Line, ...], pins_file: Path, layout: Layout
) -> None:
    index.wheels["9.2.0"] = make_wheel(index.root, "9.2.0", BASE_92)
    out = io.StringIO()
    releases.run_bump("9.2", "9.2.0", index=index, lines=lines, path=pins_file, layout=layout, out=out)
    written = load_lines(pins_file)
    assert written[0] == dataclasses.asdict(lines[0])
    assert written[1] == {
        "name": "9.2",
        "version": "9.2.0",
        "wheel_sha256": index.sha("9.2.0"),
        "source_sha256": fetch.sha256_bytes(BASE_92),
        "branch": "main",
        "covers": {"9.2.0b2": index.sha("9.2.0b2")},
        "prerelease": False,
        "sdk_version": "",
        "sdk_wheel_sha256": "",
        "sdk_source_sha256": "",
        "sdk_covers": {},
        "sdk_releases": {},
        "sdk_release_sources": {},
        "core_sdk": {},
        "auth_source_sha256": "",
        "core_sources": {},
    }
    text = out.getvalue()
    assert (
        "9.2 (9.2.0b2, pre-release) -> 9.2 (9.2.0)" in text
        and "next: python -m tools lock --line 9.2" in text
    )
    assert "prerelease" not in pins_file.read_text().split('name="9.2"')[1]


def test_bump_to_a_release_with_another_file_covers_nothing_old(
    index: FakeIndex, lines: tuple[Line, ...], pins_file: Path, layout: Layout
) -> None:
    index.wheels["9.1.4"] = make_wheel(index.root, "9.1.4", b"# changed in 9.1.4\n")
    out = io.StringIO()
    releases.run_bump("9.1", "9.1.4", index=index, lines=lines, path=pins_file, layout=layout, out=out)
    written = load_lines(pins_file)[0]
    assert written["version"] == "9.1.4" and written["covers"] == {}
    assert written["source_sha256"] == fetch.sha256_bytes(b"# changed in 9.1.4\n")
    assert "no longer covered: 9.1.2, 9.1.3" in out.getvalue()


@pytest.mark.parametrize(
    ("line", "version", "message"),
    [
        ("9.2", "9.2.0", r"9\.2\.0 is not on the package index \(the 9\.2 line has: 9\.2\.0b2, 9\.2\.0b1\)"),
        ("9.2", "9.2.0b1", r"9\.2\.0b1 is not newer than the 9\.2 line's base 9\.2\.0b2"),
        ("9.2", "9.3.0", r"9\.3\.0 is not a release of the 9\.2 line"),
        ("9.5", "9.5.0", r"unknown release line '9\.5'"),
    ],
)
def test_bump_refusals_are_one_line_and_change_nothing(
    index: FakeIndex,
    lines: tuple[Line, ...],
    pins_file: Path,
    layout: Layout,
    line: str,
    version: str,
    message: str,
) -> None:
    before = pins_file.read_bytes()
    with pytest.raises(ToolError, match=message) as info:
        releases.run_bump(line, version, index=index, lines=lines, path=pins_file, layout=layout)
    assert "\n" not in str(info.value)
    assert pins_file.read_bytes() == before
    assert index.downloads == []


def test_bump_through_the_cli(
    index: FakeIndex,
    lines: tuple[Line, ...],
    pins_file: Path,
    layout: Layout,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    index.wheels["9.2.0"] = make_wheel(index.root, "9.2.0", BASE_92)
    monkeypatch.setattr(releases, "PipIndex", lambda: index)
    monkeypatch.setattr(releases, "PINS_FILE", pins_file)
    monkeypatch.setattr(pins, "LINES", lines)
    monkeypatch.setenv("LEPATCH_CACHE", str(layout.cache))
    assert cli.main(["pins", "--bump", "9.2", "9.2.0"]) == 0
    assert load_lines(pins_file)[1]["version"] == "9.2.0"
    assert cli.main(["pins", "--bump", "9.2", "9.2.0b1"]) == 1
    assert "9.2.0b1 is not newer than the 9.2 line's base 9.2.0b2" in capsys.readouterr().err
    assert cli.main(["pins", "--write"]) == 1


@pytest.mark.parametrize("command", ["wheels", "package"])
def test_line_options_select_lines_by_name_or_covered_version(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = cli.build_parser()
    every = parser.parse_args([command])
    assert pins.selected_lines(every) == list(pins.LINES)
    primary = pins.PRIMARY
    chosen = parser.parse_args([command, "--line", pins.LINES[-1].name, "--line", next(iter(primary.covers))])
    assert pins.selected_lines(chosen) == [pins.LINES[-1], primary]
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--line", "9.9"])
    assert "argument --line: unknown release line '9.9'; pinned lines: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["apply", "--line", "3.3.1"],
        ["stage", "--line", "3.3.1"],
        ["verify", "--line", "3.3.1"],
        ["checkout", "--line", "3.3.1", "dir"],
        ["faithful", "--line", "3.3.1"],
        ["lock", "--line", "3.3.1"],
        ["upstream-supervisor-tests", "--line", "3.3.1"],
        ["upstream-tests", "--stage", "1", "--line", "3.3.1"],
        ["bench", "--line", "3.3.1"],
        ["chaos"],  # the primary line, 3.3
    ],
)
def test_every_line_option_is_a_line_once_parsed(argv: list[str]) -> None:
    value = cli.build_parser().parse_args(argv).line
    assert (value if isinstance(value, pins.Line) else value[0]) == pins.get_line("3.3")

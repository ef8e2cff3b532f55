"""`nox -s tests`: the cells it runs, its arguments, and what it makes of each cell's pytest."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from tools.engine import testrun
from tools.engine.testrun import Cell
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import Layout


def test_the_tools_then_every_line_then_the_newer_pythons() -> None:
    lines = [ln.name for ln in pins.LINES]
    assert testrun.cell_names() == ["tools", *lines, "3.3-py3.12+", "3.4-py3.12+"]
    assert testrun.cell_names(["3.4"]) == ["3.4", "3.4-py3.12+"]
    assert testrun.cell_names(["3.1", "tools"]) == ["tools", "3.1"]
    with pytest.raises(ToolError, match=r"--line '3.9': not a pinned line"):
        testrun.cell_names(["3.9"])


@pytest.mark.parametrize(
    ("posargs", "expected"),
    [
        ([], ["--"]),
        (["--line", "3.2", "-x", "-k", "drain"], ["--line", "3.2", "--", "-x", "-k", "drain"]),
        (["-q", "--jobs=1", "--line", "tools"], ["--jobs=1", "--line", "tools", "--", "-q"]),
    ],
)
def test_its_own_options_are_taken_out_of_what_goes_to_pytest(
    posargs: list[str], expected: list[str]
) -> None:
    assert testrun.split_posargs(posargs) == expected


def test_the_last_line_sums_every_cells_counts() -> None:
    cells = [
        Cell("3.3", "3.3", summary="1 failed, 110 passed, 2 skipped in 80.1s"),
        Cell("tools", "tools", summary="576 passed, 1 skipped, 3 deselected in 300s"),
        Cell("3.1", "3.1", summary="1 error in 0.3s"),
    ]
    assert testrun.totals(cells) == "686 passed, 1 failed, 1 errors, 3 skipped, 3 deselected"
    assert testrun.totals([]) == "0 passed, 0 failed"


def _project(root: Path, body: str) -> Layout:
    (root / "t").mkdir(parents=True)
    (root / "t" / "test_one.py").write_text(body)
    return Layout(root=root)


def _cell(name: str) -> Cell:
    return Cell(name, name, python=Path(sys.executable), paths=["t"])


@pytest.mark.timeout(120)
def test_a_cell_passes_fails_and_logs_to_build_tests(tmp_path: Path) -> None:
    ok = _project(tmp_path / "ok", "def test_a():\n    pass\n")
    assert not testrun.run_cell(_cell("3.3"), ["-q"], ok).failed
    log = ok.build / "tests" / "3.3.log"
    assert "1 passed" in log.read_text()

    bad = _project(tmp_path / "bad", "def test_a():\n    assert False\n")
    cell = testrun.run_cell(_cell("3.2"), ["-q"], bad)
    assert cell.failed and cell.returncode == 1 and cell.summary.startswith("1 failed")

    empty = Cell("tools", "tools", python=Path(sys.executable), paths=["t"], has_tests=False)
    (tmp_path / "empty" / "t").mkdir(parents=True)
    assert not testrun.run_cell(empty, ["-q"], Layout(root=tmp_path / "empty")).failed  # exit 5


@pytest.mark.timeout(120)
def test_cells_run_side_by_side_and_each_ones_output_is_printed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = _project(tmp_path, "import time\n\ndef test_wait():\n    time.sleep(1.5)\n")
    monkeypatch.setattr(testrun, "cell_names", lambda lines: ["3.3", "3.2"])
    monkeypatch.setattr(testrun, "prepare", lambda name, layout: _cell(name))
    running: set[str] = set()
    together = threading.Event()
    real = testrun.run_cell

    def watched(cell: Cell, args: list[str], lay: Layout) -> Cell:
        running.add(cell.name)
        if len(running) == 2:
            together.set()
        try:
            return real(cell, args, lay)
        finally:
            running.discard(cell.name)

    monkeypatch.setattr(testrun, "run_cell", watched)
    started = time.monotonic()
    assert testrun.run([], 2, ["-q"], layout) == 0
    assert together.is_set() and time.monotonic() - started < 2 * 1.5 + 5
    out = capsys.readouterr().out
    assert out.count("1 passed") >= 2 and out.rstrip().endswith("tests: 2 passed, 0 failed")
    assert "tests 3.3: ok" in out and "tests 3.2: ok" in out

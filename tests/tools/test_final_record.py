"""verify reuses the tests session's passes on the final stage only for the very code and tests."""

from __future__ import annotations

import json
from pathlib import Path

from tools.engine import final_record
from tools.shared.layout import Layout


def _layout(tmp_path: Path) -> Layout:
    tests = tmp_path / "tests" / "executor"
    tests.mkdir(parents=True)
    (tests / "test_a.py").write_text("def test_a(): pass\n")
    return Layout(root=tmp_path)


def _record(path: Path, outcomes: dict[str, str]) -> None:
    path.write_text(json.dumps({n: {"outcome": o} for n, o in outcomes.items()}))


def test_passes_are_reused_for_the_same_code_and_tests(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    record = final_record.prepare("9.9", {"x.py": b"code"}, layout)
    _record(record, {"t::a": "pass", "t::b": "fail", "t::c": "skip"})
    assert final_record.passed("9.9", {"x.py": b"code"}, layout) == {"t::a"}


def test_nothing_is_reused_for_other_code_or_changed_tests(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _record(final_record.prepare("9.9", {"x.py": b"code"}, layout), {"t::a": "pass"})
    assert final_record.passed("9.9", {"x.py": b"other code"}, layout) == set()
    (layout.tests_executor / "test_a.py").write_text("def test_a(): assert False\n")
    assert final_record.passed("9.9", {"x.py": b"code"}, layout) == set()


def test_prepare_forgets_the_previous_record(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _record(final_record.prepare("9.9", {"x.py": b"code"}, layout), {"t::a": "pass"})
    final_record.prepare("9.9", {"x.py": b"code"}, layout)  # a run that died before writing its record
    assert final_record.passed("9.9", {"x.py": b"code"}, layout) == set()
    assert final_record.passed("8.8", {"x.py": b"code"}, layout) == set()

"""`nox -s typecheck` answers for the series' lines only: the overlay against the released files."""

from __future__ import annotations

from tools.lint import new_type_errors

RELEASED = """\
airflow/api/base_auth_manager.py:655: error: Argument 1 to "add" of "set" has incompatible type  [arg-type]
airflow/executors/local_executor.py:93: note: By default the bodies of untyped functions are not checked
Found 1 error in 1 file (checked 3 source files)
"""


def test_an_error_upstream_ships_is_not_the_overlays_even_where_a_patch_moved_it() -> None:
    moved = RELEASED.replace(":655:", ":659:")
    assert new_type_errors(moved, RELEASED) == []


def test_an_error_the_series_adds_is_reported_without_its_line_number() -> None:
    added = (
        RELEASED
        + 'airflow/api/base_auth_manager.py:160:12: error: "object" has no attribute "x"  [attr-defined]\n'
    )
    assert new_type_errors(added, RELEASED) == [
        'airflow/api/base_auth_manager.py: error: "object" has no attribute "x"  [attr-defined]'
    ]


def test_a_second_copy_of_an_upstream_error_is_new() -> None:
    twice = RELEASED + RELEASED.splitlines()[0].replace(":655:", ":700:") + "\n"
    assert len(new_type_errors(twice, RELEASED)) == 1

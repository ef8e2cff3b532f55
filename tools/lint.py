"""``python -m tools lint-series``: the series and what stands beside it, checked without running it.

It reads every package's records, so it stands above them all: the series' conventions
(``tools.engine.series``), the standalone PRs' headers (``tools.delivery.upstream_prs``), the diffs to
upstream's test file and their records (``tools.delivery.upstream_tests``), the series
applied to every line (``tools.engine.apply``) with its churn ratchet (``tools.engine.churn``),
and the model's overlay hash (``tools.measure.model``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping

from tools.delivery import upstream_prs, upstream_tests
from tools.engine import apply as engine_mod
from tools.engine import churn
from tools.engine.series import (
    check_applied_upstream,
    check_authors,
    check_fields,
    fixed_by_markers,
    load_series,
    read_series_names,
    unreviewed,
)
from tools.measure import model
from tools.shared import pins
from tools.shared.layout import DEFAULT, Layout


def lint_series(layout: Layout = DEFAULT, notes: list[str] | None = None) -> list[str]:
    """Every problem with the series, one line each; empty when the series is sound. ``notes`` gets
    what was not checked and why (upstream's reference test file absent, as on a fresh clone)."""
    series = load_series(layout)
    errors = list(series.problems)
    seen: set[str] = set()
    for name in series.names:
        if name in seen:
            errors.append(f"patches/series lists {name} twice")
        seen.add(name)
    for p in series.ordered():
        errors.extend(check_fields(p))
    errors.extend(check_authors(series))
    if layout.patches.is_dir():
        for path in sorted(layout.patches.glob("*.patch")):
            if path.name not in seen:
                errors.append(f"patches/{path.name} is not listed in patches/series")
    line_names = {line.name for line in pins.LINES}
    if layout.resolutions.is_dir():
        for entry in sorted(layout.resolutions.iterdir()):
            if not entry.is_dir():
                errors.append(f"patches/resolutions/{entry.name}: expected a directory per release line")
            elif entry.name not in line_names:
                errors.append(
                    f"patches/resolutions/{entry.name}/ is for an unknown line "
                    f"(pinned: {', '.join(sorted(line_names))})"
                )
    for (line_name, name), res in sorted(series.resolutions.items()):
        if name not in seen:
            errors.append(f"patches/resolutions/{line_name}/{name} resolves a patch not in patches/series")
        elif not res.files:
            errors.append(f"patches/resolutions/{line_name}/{name} contains no diff")
        for mark in unreviewed(res.diff or res.text):
            errors.append(
                f"patches/resolutions/{line_name}/{name} adds {mark!r}: a place the port left for review"
            )
    errors += upstream_prs.lint(layout)
    problems, skipped = upstream_tests.check(layout, series.names)
    errors += problems
    if notes is not None:
        notes.extend(skipped)
    for where, lineno, name in fixed_by_markers(layout, series):
        if name not in seen:
            at = f"{where}:{lineno}" if lineno else where
            errors.append(f"{at}: fixed_by({name!r}) names a patch not in patches/series")
    return errors


def lint_against_engine(layout: Layout = DEFAULT, notes: list[str] | None = None) -> list[str]:
    """
    The checks that need the series applied to every line (the engine downloads the bases).

    ``notes`` gets where each line's churn stands against its ratchet (not problems).
    """
    engine = engine_mod.Engine(layout)
    results = engine.apply_all()
    statuses = {name: [p.status for p in res.patches] for name, res in results.items()}
    errors = check_applied_upstream(engine.series, statuses)
    return errors + churn_problems(engine, results, notes) + model.overlay_hash_problems()


def churn_problems(
    engine: engine_mod.Engine,
    results: dict[str, engine_mod.LineResult],
    notes: list[str] | None = None,
    ceilings: Mapping[str, int] = churn.CEILINGS,
) -> list[str]:
    """The churn ratchet (``tools.engine.churn``): a line above its ceiling, or one not measured."""
    errors = [
        f"churn: {name} not measured: a patch fails to apply there (nox -s apply)"
        for name, res in results.items()
        if not res.ok
    ]
    churns = [churn.line_churn(name, r.stages, engine.series) for name, r in results.items() if r.ok]
    if notes is not None:
        notes.extend(churn.ratchet_notes(churns, ceilings))
    return errors + churn.ratchet(churns, ceilings)


def new_type_errors(overlay_report: str, base_report: str) -> list[str]:
    """mypy's errors in the overlay's files that the untouched upstream files do not have.

    Upstream's files are checked by upstream's own mypy setup, not ours, and some of their lines
    fail ours (3.3's base_auth_manager.py adds an ``str | None`` to a ``set[str]``); the series
    answers for its own lines. Errors are compared without their line numbers, as a multiset,
    so a patch that moves an upstream error down the file adds nothing and one that adds a second
    copy of an error is caught.
    """

    def errors(report: str) -> list[str]:
        return [
            re.sub(r"^([^:]+):\d+(?::\d+)?: ", r"\1: ", row)
            for row in report.splitlines()
            if re.match(r"^[^:]+:\d+(?::\d+)?: error: ", row)
        ]

    left = errors(base_report)
    out = []
    for error in errors(overlay_report):
        if error in left:
            left.remove(error)
        else:
            out.append(error)
    return out


def _cmd_lint(args: argparse.Namespace) -> int:
    notes: list[str] = []
    errors = lint_series(notes=notes)
    if not errors:
        errors = lint_against_engine(notes=notes)
    for note in notes:
        print(note)
    for e in errors:
        print(e)
    n = len(read_series_names(DEFAULT.series_file))
    if errors:
        print(f"lint-series: {len(errors)} problem(s)")
        return 1
    print(f"lint-series: {n} patch(es), no problems")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lint-series", help="check patches/series, DEP-3 headers, resolutions, fixed_by markers"
    )
    p.set_defaults(func=_cmd_lint)

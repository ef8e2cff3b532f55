"""Standalone upstream PRs: one bug each, fixed in upstream's current design, outside the series.

``patches/upstream-prs/list`` names them in order (quilt style, ``#`` comments). Each is a
``git format-patch --full-index`` mail against the pinned base of the line upstream ``main``
stands for (3.4.0b2), with the series' DEP-3 block (CONTRIBUTING.md) plus ``Regression-Test:``:
the pytest node ids (repo layout, comma-separated) that must fail on that base and pass with the
patch. The engine never applies them and they depend on no patch of the series; ``nox -s pr --
--repo CLONE --standalone N`` prepares one as a PR branch (``tools.delivery.pr``).

``python -m tools upstream-prs`` lists them; ``--check [N ...]`` proves, for each, that it applies
strictly (no fuzz) to the pinned base's ``local_executor.py``, and, in the line's venv, that its test
files run with the base executor installed fail at each Regression-Test (and nowhere else), and with
the patched executor pass. ``lint`` (part of ``lint-series``) checks the list and the headers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tools.delivery import lineform
from tools.delivery.pr_testrun import TestRun, run_test_files
from tools.engine.series import Patch, check_fields, read_patch, read_series_names
from tools.shared import pins, table
from tools.shared.errors import ToolError
from tools.shared.gitcmd import GitError, git
from tools.shared.layout import DEFAULT, Layout

LIST_NAME = "list"
TEST_FIELD = "Regression-Test"


class UpstreamPrError(ToolError):
    """A standalone PR that is missing, malformed or does not apply (``reason``: the short why)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def line() -> pins.Line:
    """The line upstream ``main`` stands for: the standalone PRs' base."""
    found = lineform.line_of_branch("main")
    if found is None:
        raise UpstreamPrError("no pinned line has branch 'main' (tools/shared/pins.py)")
    return found


def names(layout: Layout = DEFAULT) -> list[str]:
    listed = layout.upstream_prs / LIST_NAME
    return read_series_names(listed) if listed.is_file() else []


def match(entries: Sequence[str], wanted: str) -> str | None:
    """The entry ``wanted`` names by file name, stem or number (``2``, ``0002``), if any."""
    want = Path(wanted).name
    for entry in entries:
        stem = entry.removesuffix(".patch")
        number = stem.split("-", 1)[0]
        if want in (entry, stem) or (want.isdigit() and number.isdigit() and int(want) == int(number)):
            return entry
    return None


def find(layout: Layout, wanted: str) -> Path:
    """A standalone PR by file name, stem or number (``2``, ``0002``)."""
    if entry := match(names(layout), wanted):
        return layout.upstream_prs / entry
    raise UpstreamPrError(f"{layout.rel(layout.upstream_prs / LIST_NAME)}: no standalone PR {wanted!r}")


def regression_tests(patch: Patch) -> list[str]:
    value = patch.field(TEST_FIELD) or ""
    return [t for t in (part.strip() for part in value.split(",")) if t]


def test_files(patch: Patch) -> list[str]:
    return [p for p in patch.touched if Path(p).name.startswith("test_") and p.endswith(".py")]


def lint(layout: Layout = DEFAULT) -> list[str]:
    """Every problem with ``patches/upstream-prs/``, one line each."""
    directory = layout.upstream_prs
    if not directory.is_dir():
        return []
    where = layout.rel(directory)
    errors = []
    listed = names(layout)
    if not (directory / LIST_NAME).is_file():
        errors.append(f"{where}/{LIST_NAME} is missing")
    for path in sorted(directory.glob("*.patch")):
        if path.name not in listed:
            errors.append(f"{where}/{path.name} is not listed in {where}/{LIST_NAME}")
    for name in listed:
        path = directory / name
        if not path.is_file():
            errors.append(f"{where}/{LIST_NAME} lists {name}, which is missing")
            continue
        patch = read_patch(path)
        errors += [e.replace(f"patches/{name}:", f"{where}/{name}:", 1) for e in check_fields(patch)]
        if pins.REPO_PATH not in patch.touched:
            errors.append(f"{where}/{name}: does not change {pins.REPO_PATH}")
        tests = regression_tests(patch)
        if not tests:
            errors.append(f"{where}/{name}: missing required header {TEST_FIELD} (DEP-3 block)")
        for test in tests:
            if test.split("::", 1)[0] not in test_files(patch):
                errors.append(f"{where}/{name}: {TEST_FIELD} {test} is not in a test file the patch adds")
    return errors


def apply_to(patch_path: Path, base: bytes) -> dict[str, bytes]:
    """The files the patch leaves on a tree holding only ``base`` as the executor; strict, no fuzz.
    An error names the pinned base's version."""
    patch = read_patch(patch_path)
    with tempfile.TemporaryDirectory(prefix="lepatch-upstream-pr-") as tmp:
        root = Path(tmp)
        git("init", "-q", cwd=root, isolated=True)
        (root / pins.REPO_PATH).parent.mkdir(parents=True)
        (root / pins.REPO_PATH).write_bytes(base)
        try:
            git("apply", "--whitespace=nowarn", str(patch_path.resolve()), cwd=root, isolated=True)
        except GitError as exc:
            from tools.engine.apply import describe_apply_error

            reason = describe_apply_error(patch, exc.stderr)
            onto = f"{pins.REPO_PATH} of {line().version}"
            raise UpstreamPrError(f"{patch_path.name}: does not apply to {onto}: {reason}", reason) from exc
        return {p: (root / p).read_bytes() for p in patch.touched if (root / p).is_file()}


@dataclass
class Checked:
    name: str
    applies: str  # "clean" or the one-line reason it does not
    tests: list[str]  # the Regression-Test ids
    base: TestRun | None = None  # with the unpatched executor
    fixed: TestRun | None = None  # with the patched executor

    @property
    def ok(self) -> bool:
        """Applies; unpatched, exactly the Regression-Tests fail; patched, everything passes."""
        return (
            self.applies == "clean"
            and self.base is not None
            and self.fixed is not None
            and self.base.returncode == 1
            and set(self.base.failed) == set(self.tests)
            and self.fixed.passed
        )


# (tree, test files, line, python) -> TestRun: tools.delivery.pr_testrun.run_test_files, or a fake in tests
Runner = Callable[[Path, Sequence[str], pins.Line, "Path | None"], "TestRun"]


def check(
    layout: Layout = DEFAULT,
    wanted: Sequence[str] = (),
    *,
    base: bytes | None = None,
    python: Path | None = None,
    runner: Runner | None = None,
    run_tests: bool = True,
) -> list[Checked]:
    """Apply each standalone PR to the pinned base and run its tests without and with it."""
    run = runner or run_test_files
    target = line()
    if base is None:
        from tools.engine.fetch import read_base

        base = read_base(target, layout)
    paths = [find(layout, w) for w in wanted] if wanted else [layout.upstream_prs / n for n in names(layout)]
    out = []
    for path in paths:
        patch = read_patch(path)
        result = Checked(path.name, "clean", regression_tests(patch))
        try:
            tree = apply_to(path, base)
        except UpstreamPrError as exc:
            result.applies = exc.reason
            out.append(result)
            continue
        if run_tests:
            files = test_files(patch)
            with tempfile.TemporaryDirectory(prefix="lepatch-upstream-pr-run-") as tmp:
                root = Path(tmp)
                for rel, data in tree.items():
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_bytes(data)
                (root / pins.REPO_PATH).write_bytes(base)
                result.base = run(root, files, target, python)
                (root / pins.REPO_PATH).write_bytes(tree[pins.REPO_PATH])
                result.fixed = run(root, files, target, python)
        out.append(result)
    return out


def _cell(run: TestRun | None) -> str:
    if run is None:
        return "-"
    if not run.ran:
        return f"NOT RUN: {run.summary}"
    return f"{'pass' if run.passed else 'FAIL'} ({run.summary})"


def render(results: Sequence[Checked], version: str) -> str:
    rows = [("standalone PR", "applies", f"{version} unpatched", "with the patch", "")]
    rows += [
        (r.name.removesuffix(".patch"), r.applies, _cell(r.base), _cell(r.fixed), "ok" if r.ok else "!")
        for r in results
    ]
    lines = table.render(rows)
    for r in results:
        base_failed = r.base.failed if r.base else []
        for test in r.tests:
            verdict = "fails" if test in base_failed else "DOES NOT FAIL"
            lines.append(f"  {r.name[:4]} {test.rsplit('::', 1)[-1]}: {verdict} unpatched")
        extra = sorted(set(base_failed) - set(r.tests))
        lines += [f"  {r.name[:4]} also fails unpatched (not a Regression-Test): {t}" for t in extra]
        if r.fixed is not None:
            lines += [
                f"  {r.name[:4]} with the patch, {n[0].lower()}{n[1:]}"
                for n in r.fixed.notes
                if n.startswith(("failed:", "error:"))
            ]
    return "\n".join(lines)


def main_check(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    results = check(wanted=args.names, python=args.python)
    print(render(results, line().version), file=out)
    bad = [r.name for r in results if not r.ok]
    if bad:
        print(f"upstream-prs: {len(bad)} of {len(results)} not as required: {', '.join(bad)}", file=out)
        return 1
    print(f"upstream-prs: {len(results)} standalone PR(s): each applies to {line().version}, "
          "its regression tests fail there and pass with it", file=out)  # fmt: skip
    return 0


def _cmd(args: argparse.Namespace) -> int:
    if args.check:
        return main_check(args)
    problems = lint()
    for name in names():
        patch = read_patch(DEFAULT.upstream_prs / name)
        print(f"{name}  {patch.subject}")
        for test in regression_tests(patch):
            print(f"    {TEST_FIELD}: {test}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "upstream-prs", help="list the standalone upstream PRs; --check: apply to 3.4.0b2, tests fail/pass"
    )
    p.add_argument("names", nargs="*", help="which (number, stem or file name; default: all)")
    p.add_argument(
        "--check", action="store_true", help="apply each to the pinned base and run its tests twice"
    )
    p.add_argument("--python", type=Path, help="run the tests with this interpreter as it is (no venv)")
    p.set_defaults(func=_cmd)

"""Upstream's own ``test_local_executor.py`` on the 3.4 line, with the series' changes to it.

Upstream's test file is not project code: it is read at run time from ``../shared/upstream/``
(``--upstream DIR`` or ``LEPATCH_UPSTREAM_DIR`` move it) and never copied into this tree. What the
series' PRs must change in it lives in ``patches/upstream-tests/<patch stem>.diff``, one unified diff
per executor PR (7, 8, 9), applied in series order: after PR K's diff the whole file passes on
stage K of the pre-release line. Each diff opens with a record, one line per upstream test it
touches, before its ``---`` line (``git apply`` skips it)::

    # upstream test | what changed | why | now covered by
    TestLocalExecutor::test_x | drops result_queue | removed internal | TestLocalExecutor::test_x

``why`` is one of ``WHY``; "now covered by" names a test of the same branch (upstream's file, or
``file.py::test`` of the series' own tests). ``check`` (``lint-series``) holds the records to the
diffs; ``run`` runs the whole file with pytest in its own venv (``venvs.ensure(upstream_tests=True)``:
the 3.4 line's pins plus ``kgb`` and ``pytest-mock``), stage K's ``local_executor.py`` and
``supervisor.py`` installed, no database, with the project's stand-ins for what Airflow's
``tests_common`` and conftest give it (``tests/upstream_standins/``).

    python -m tools upstream-tests --stage 7                 # diffs 0007 applied; fork
    python -m tools upstream-tests --stage 9 --start-method spawn
    python -m tools upstream-tests --stage 9 --no-diffs      # upstream's file as it is
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

REPO_FILE = "airflow-core/tests/unit/executors/test_local_executor.py"
UPSTREAM_ENV = "LEPATCH_UPSTREAM_DIR"
START_METHOD_ENV = (
    "LEPATCH_UPSTREAM_START_METHOD"  # read by tests/upstream_standins/lepatch_upstream_plugin.py
)
DIFFS_DIR = "upstream-tests"
WHY = ("removed internal", "mock of a changed wait", "deliberate change")
TABLE_TITLE = "Upstream's test_local_executor.py in this PR"
PER_TEST_TIMEOUT = 120  # seconds: upstream's file bounds only some of its tests itself
RUN_TIMEOUT = 1800


class UpstreamTestsError(ToolError):
    pass


@dataclass(frozen=True)
class Record:
    test: str  # Class::test_name (or test_name), as in upstream's file
    change: str
    why: str
    covered_by: str


@dataclass
class Outcome:
    """One run of upstream's file: pytest's counts and what failed."""

    command: str
    counts: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    returncode: int | None = None
    output: str = ""

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.counts.get("failed") and not self.counts.get("error")

    @property
    def total(self) -> int:
        """Tests that ran to an outcome (an error in a test's teardown is on top of its outcome)."""
        return sum(n for k, n in self.counts.items() if k != "error")

    def summary(self) -> str:
        order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
        parts = [f"{self.counts[k]} {k}" for k in order if self.counts.get(k)]
        return ", ".join(parts) or "no tests ran"


# -------------------------------------------------------------------- where things are


def reference_dir(layout: Layout = DEFAULT, override: Path | None = None) -> Path:
    """``../shared/upstream/`` beside the repository, unless ``override`` or ``LEPATCH_UPSTREAM_DIR`` says."""
    if override is not None:
        return Path(override)
    if os.environ.get(UPSTREAM_ENV):
        return Path(os.environ[UPSTREAM_ENV])
    return layout.root.parent / "shared" / "upstream"


def reference_file(layout: Layout = DEFAULT, override: Path | None = None) -> Path:
    return reference_dir(layout, override) / REPO_FILE


def read_reference(layout: Layout = DEFAULT, override: Path | None = None) -> str:
    path = reference_file(layout, override)
    if not path.is_file():
        raise UpstreamTestsError(
            f"{path}: upstream's test file is missing (pass --upstream DIR or set {UPSTREAM_ENV})"
        )
    return path.read_text()


def diffs_dir(layout: Layout = DEFAULT) -> Path:
    return layout.patches / DIFFS_DIR


def existing_diffs(layout: Layout, names: Sequence[str]) -> list[Path]:
    """The diffs of the patches ``names`` that have one, in their order."""
    diffs = [diffs_dir(layout) / (n.removesuffix(".patch") + ".diff") for n in names]
    return [d for d in diffs if d.is_file()]


# -------------------------------------------------------------------- diffs and their records


def parse_records(diff_text: str, where: str = "") -> tuple[list[Record], list[str]]:
    """The record at the head of a diff (before its first ``---``/``diff --git`` line), and problems."""
    records: list[Record] = []
    problems: list[str] = []
    for number, line in enumerate(diff_text.splitlines(), 1):
        if line.startswith(("--- ", "diff --git ")):
            break
        if not line.strip() or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(" | ")]
        if len(fields) != 4 or not all(fields):
            problems.append(f"{where}:{number}: a record line has 4 fields: test | change | why | covered by")
            continue
        record = Record(*fields)
        if record.why not in WHY:
            problems.append(f"{where}:{number}: why {record.why!r} is not one of: {', '.join(WHY)}")
        records.append(record)
    return records, problems


def apply_diff(text: str, diff: Path) -> str:
    """``text`` (upstream's file) with ``diff`` applied strictly (``git apply``, full context, no fuzz)."""
    with tempfile.TemporaryDirectory(prefix="lepatch-upstream-tests-") as tmp:
        target = Path(tmp) / REPO_FILE
        target.parent.mkdir(parents=True)
        target.write_text(text)
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(diff.resolve())],
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
            check=False,
        )
        if proc.returncode != 0:
            detail = next((ln for ln in proc.stderr.splitlines() if ln.startswith("error")), proc.stderr)
            raise UpstreamTestsError(
                f"{diff.name} does not apply to upstream's {REPO_FILE}: {detail.strip()}"
            )
        return target.read_text()


def _module_defs(tree: ast.Module) -> dict[str, str]:
    """Module-level functions (helpers, fixtures) by name -> their source, decorators included."""
    return {
        n.name: ast.dump(n)
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not n.name.startswith("Test")
    }


def test_nodes(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every test function of a module by name (``test_x``, ``Class::test_x``)."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    out[f"{node.name}::{item.name}"] = item
    return out


def _names_used(node: ast.AST) -> set[str]:
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        used |= {a.arg for a in node.args.args}  # fixtures by parameter name
    return used


def touched_tests(before: str, after: str) -> set[str]:
    """Tests whose code differs, that were added or removed, or that use (through module-level helpers and
    fixtures, by name) a helper whose code differs."""
    old, new = ast.parse(before), ast.parse(after)
    old_tests, new_tests = test_nodes(old), test_nodes(new)
    old_defs, new_defs = _module_defs(old), _module_defs(new)
    changed = {n for n in set(old_defs) | set(new_defs) if old_defs.get(n) != new_defs.get(n)}
    helpers = {n.name: n for n in new.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    # Close over helpers that use a changed helper.
    while grown := {n for n, node in helpers.items() if n not in changed and _names_used(node) & changed}:
        changed |= grown
    out = set(old_tests) ^ set(new_tests)
    for name in set(old_tests) & set(new_tests):
        if ast.dump(old_tests[name]) != ast.dump(new_tests[name]) or _names_used(new_tests[name]) & changed:
            out.add(name)
    return out


def check(
    layout: Layout = DEFAULT, names: Sequence[str] | None = None, upstream: Path | None = None
) -> tuple[list[str], list[str]]:
    """Problems with ``patches/upstream-tests/``, and notes (what was skipped and why)."""
    from tools.engine.series import read_series_names

    problems: list[str] = []
    notes: list[str] = []
    folder = diffs_dir(layout)
    if not folder.is_dir():
        return problems, notes
    names = list(names) if names is not None else read_series_names(layout.series_file)
    stems = {n.removesuffix(".patch"): n for n in names}
    diffs = sorted(folder.glob("*.diff"))
    for path in sorted(folder.iterdir()):
        if path.suffix != ".diff":
            problems.append(f"patches/{DIFFS_DIR}/{path.name}: only <patch stem>.diff files belong here")
        elif path.stem not in stems:
            problems.append(f"patches/{DIFFS_DIR}/{path.name}: names no patch of patches/series")
    records = {}
    for path in diffs:
        found, bad = parse_records(path.read_text(), f"patches/{DIFFS_DIR}/{path.name}")
        problems += bad
        records[path] = found
        if not found:
            problems.append(f"patches/{DIFFS_DIR}/{path.name}: no record of the upstream tests it changes")
    ref = reference_file(layout, upstream)
    if not ref.is_file():
        notes.append(
            f"{ref} is absent: the upstream-tests diffs were not applied to it (records not matched)"
        )
        return problems, notes
    text = ref.read_text()
    for path in sorted(diffs, key=lambda p: names.index(stems[p.stem]) if p.stem in stems else 0):
        try:
            after = apply_diff(text, path)
        except UpstreamTestsError as exc:
            problems.append(f"patches/{DIFFS_DIR}/{path.name}: {exc}")
            return problems, notes
        touched = touched_tests(text, after)
        recorded = {r.test for r in records[path]}
        where = f"patches/{DIFFS_DIR}/{path.name}"
        problems += [f"{where}: changes {t} but has no record of it" for t in sorted(touched - recorded)]
        problems += [f"{where}: records {t}, which it does not change" for t in sorted(recorded - touched)]
        tests_after = set(test_nodes(ast.parse(after)))
        for r in records[path]:
            if "::" in r.covered_by and r.covered_by.split("::", 1)[0].endswith(".py"):
                continue  # a test of the series' own files (the PR's branch has them)
            if r.covered_by not in tests_after:
                problems.append(f"{where}: {r.test} is covered by {r.covered_by}, which is not in the file")
        text = after
    return problems, notes


# -------------------------------------------------------------------- running the file

_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")


def parse_counts(output: str) -> dict[str, int]:
    """pytest's closing line's counts (``error`` for errors)."""
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", ln)]
    if not lines:
        return {}
    counts: dict[str, int] = {}
    for number, word in _COUNT.findall(lines[-1]):
        word = "error" if word.startswith("error") else word
        if word in ("warning", "warnings", "deselected"):
            continue
        counts[word] = counts.get(word, 0) + int(number)
    return counts


def standins_dir(layout: Layout = DEFAULT) -> Path:
    return layout.root / "tests" / "upstream_standins"


def run_text(
    text: str,
    python: Path,
    *,
    start_method: str | None = None,
    layout: Layout = DEFAULT,
    extra: Sequence[str] = (),
) -> Outcome:
    """Run ``text`` (the test file) with pytest under ``python`` (its venv has the executor installed),
    from a temporary directory outside the repository, with the stand-ins."""
    with tempfile.TemporaryDirectory(prefix="lepatch-upstream-tests-") as tmp:
        root = Path(tmp)
        (root / "test_local_executor.py").write_text(text)
        (root / "pytest.ini").write_text("[pytest]\n")
        run_env = dict(os.environ)
        run_env.setdefault("AIRFLOW_HOME", str(root / "airflow-home"))
        run_env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        run_env.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", "lepatch-tests-not-a-secret")
        run_env["PYTHONPATH"] = str(standins_dir(layout))
        if start_method:
            run_env[START_METHOD_ENV] = start_method
        else:
            run_env.pop(START_METHOD_ENV, None)
        args = ["-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-p", "lepatch_upstream_plugin"]
        args += [f"--timeout={PER_TEST_TIMEOUT}", "test_local_executor.py", *extra]
        shown = "python -m pytest test_local_executor.py" + (f" [{start_method}]" if start_method else "")
        return run_pytest([str(python), *args], root, run_env, shown)


def run_pytest(
    cmd: Sequence[str], cwd: Path, env: Mapping[str, str], shown: str, timeout: float = RUN_TIMEOUT
) -> Outcome:
    """Run one pytest command (``-rfEs``: its failures and errors listed) and read its outcome."""
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        return Outcome(shown, {}, [], None, f"timed out after {exc.timeout}s")
    failed = [
        ln.split(" ", 1)[1].split(" - ", 1)[0]
        for ln in proc.stdout.splitlines()
        if ln.startswith(("FAILED ", "ERROR "))
    ]
    return Outcome(shown, parse_counts(proc.stdout), failed, proc.returncode, proc.stdout + proc.stderr)


def run_stage(
    stage: int,
    *,
    line: pins.Line | None = None,
    with_diffs: bool = True,
    start_method: str | None = None,
    upstream: Path | None = None,
    layout: Layout = DEFAULT,
    extra: Sequence[str] = (),
) -> tuple[Outcome, list[Path]]:
    """Upstream's file with the diffs of the first ``stage`` patches, on stage ``stage`` of ``line``."""
    from tools.engine import venvs
    from tools.engine.apply import Engine

    text = read_reference(layout, upstream)
    engine = Engine(layout)
    line = line or pre_release_line()
    result = engine.apply_line(line)
    sources = result.sources(stage)
    diffs = existing_diffs(layout, engine.series.names[:stage]) if with_diffs else []
    for diff in diffs:
        text = apply_diff(text, diff)
    python = venvs.ensure(line, layout, upstream_tests=True)
    venvs.install_sources(python, sources)
    return run_text(text, python, start_method=start_method, layout=layout, extra=extra), diffs


def pre_release_line() -> pins.Line:
    return next(ln for ln in pins.LINES if ln.prerelease)


# -------------------------------------------------------------------- the PR body's table


def render_table(records: Sequence[Record], outcome: Outcome | None, branch_note: str = "") -> str:
    """The PR body's section: each upstream test the PR changes, why, what covers it; the whole file's run."""
    lines = [f"### {TABLE_TITLE}", ""]
    if records:
        lines += [
            f"This PR changes {len(records)} of upstream's tests in "
            f"`{REPO_FILE}` (a test of a removed internal is rewritten against the executor's public "
            "surface; a test of a deliberate change follows the new contract):",
            "",
            "| upstream test | what changed | why | now covered by |",
            "|---|---|---|---|",
        ]
        lines += [f"| `{r.test}` | {r.change} | {r.why} | `{r.covered_by}` |" for r in records]
    else:
        lines.append(f"This PR changes no test in `{REPO_FILE}`.")
    lines.append("")
    if outcome is None:
        lines.append(f"The whole file was not run{': ' + branch_note if branch_note else ''}.")
    elif not outcome.counts:
        lines.append(f"The whole file on this branch: could not run ({outcome.output.strip()[-200:]}).")
    else:
        verdict = "passes" if outcome.passed else "FAILS"
        lines.append(
            f"The whole file on this branch {verdict}: {outcome.summary()} ({outcome.total} tests"
            f"{', ' + branch_note if branch_note else ''})."
        )
        lines += [f"- failed: `{t}`" for t in outcome.failed[:20]]
    return "\n".join(lines)


# -------------------------------------------------------------------- CLI


def _cmd(args: argparse.Namespace) -> int:
    try:
        outcome, diffs = run_stage(
            args.stage,
            line=args.line,
            with_diffs=args.diffs,
            start_method=args.start_method,
            upstream=args.upstream,
            extra=args.pytest_args or [],
        )
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.verbose or not outcome.counts:
        print(outcome.output.rstrip())
    else:
        for failed in outcome.failed:
            print(f"  failed: {failed}")
    line = (args.line or pre_release_line()).name
    applied = ", ".join(d.name.split("-", 1)[0] for d in diffs) or "none"
    method = args.start_method or "default start method"
    print(
        f"upstream-tests: {line} stage {args.stage}, diffs applied: {applied}, {method}: "
        f"{outcome.summary()} ({outcome.total} tests)"
    )
    return 0 if outcome.passed else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "upstream-tests",
        help="run upstream's test_local_executor.py (with the series' diffs to it) on a 3.4 stage",
    )
    p.add_argument("--stage", type=int, required=True, help="stage K of the line: its first K patches")
    p.add_argument("--line", type=pins.line_arg, help="the line (default: the pre-release line, 3.4)")
    p.add_argument("--no-diffs", dest="diffs", action="store_false", help="upstream's file as it is")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), help="for the whole run")
    p.add_argument(
        "--upstream",
        type=Path,
        help=f"the upstream reference directory (default: ../shared/upstream, or ${UPSTREAM_ENV})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print pytest's whole output")
    p.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (-k, -x)")
    p.set_defaults(func=_cmd)

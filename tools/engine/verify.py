"""``verify``: every regression test fails before its patch and passes from it on, per line.

For each line and each stage k (base + first k patches), the stage's upstream files
(``local_executor.py``, task-sdk's ``supervisor.py``) are installed into the line's venv and
``pytest tests/executor tests/supervisor -m fixed_by`` runs with a small plugin recording
each test's outcome and the patch its
``fixed_by`` marker names. A test fixed by the series' i-th patch (1-based) is expected
to fail on stages 0..i-1 and pass on stages i..N; any other cell is unexpected (``!``).

On a line whose base already carries a patch (the engine's ``upstream`` status: 3.4 ships
patches 1-3), the tests it fixes are expected to pass on every stage, shown ``up``. Stages
whose upstream files are byte-identical to one already run (3.4's stages 0-3) are not
run again: their cells are that stage's outcomes.

By default each test runs only on the stages that decide its verdict: the one before its patch
(must fail: the bug is reproduced) and every one from its patch on (must pass). Stages further
back would only fail again, each after the test's deadline, which is where most of the time of
a full matrix goes; their cells are shown ``.`` (not run). A bug the series introduced runs from
the stage before the patch that introduced it; on a line whose base carries the patch, every
stage runs. ``--every-stage`` runs every test on every stage: the full matrix. On the final
stage, tests that passed in ``nox -s tests`` on the same code and tests are not run again
(``tools.engine.final_record``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.engine import apply as engine_mod
from tools.engine import final_record, venvs
from tools.engine.fixed_by_plugin import RECORD_ENV
from tools.engine.series import fixed_by_markers
from tools.shared import pins, table
from tools.shared.errors import ToolError
from tools.shared.layout import Layout
from tools.shared.pins import Line

PASS, FAIL, ERROR, SKIP, MISSING = "pass", "fail", "error", "skip", "missing"
# A stage before the one preceding the test's patch, not run by the default plan; never unexpected.
NOT_RUN = "not-run"
# Failed only because the stage lacks an attribute the test drives: not a reproduction.
CANNOT_RUN = "n/a"
# Failed where it should pass, then passed when run again at once: the early stages carry races
# of their own (the unpatched end() can lose a shutdown message), so one rerun is allowed and the
# cell is shown as ``pass*`` rather than hidden.
FLAKY = "flaky"
# Passed where the bug should show, then failed when run again at once: a race reproduced on the second
# try is still reproduced; shown ``FAIL*``.
FLAKY_FAIL = "flaky-fail"


@dataclass
class Cell:
    outcome: str
    expected: str
    upstream: bool = False  # the line's base already carries the fixing patch

    @property
    def unexpected(self) -> bool:
        if self.outcome == NOT_RUN:
            return False
        outcome = {FLAKY: PASS, FLAKY_FAIL: FAIL, CANNOT_RUN: FAIL}.get(self.outcome, self.outcome)
        return outcome != self.expected

    def label(self) -> str:
        labels = {PASS: "pass", FLAKY: "pass*", FAIL: "FAIL", ERROR: "ERR", SKIP: "skip", MISSING: "-"}
        labels.update({CANNOT_RUN: "n/a", NOT_RUN: ".", FLAKY_FAIL: "FAIL*"})
        if self.upstream:
            labels.update({PASS: "up", FLAKY: "up*"})
        text = labels.get(self.outcome, "?")
        return text + ("!" if self.unexpected else "")


@dataclass
class Evaluation:
    stages: list[int]
    rows: dict[str, dict[int, Cell]] = field(default_factory=dict)
    fixed_by: dict[str, str | None] = field(default_factory=dict)
    introduced_by: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    elsewhere: set[str] = field(default_factory=set)  # tests of a bug only other lines have

    @property
    def ok(self) -> bool:
        return not self.errors and not any(c.unexpected for row in self.rows.values() for c in row.values())


def expected_outcome(stage: int, fix_index: int, introduced_index: int = 0) -> str:
    """
    A test fixed by the ``fix_index``-th patch (1-based) fails before it, passes from it.

    A bug introduced by an earlier patch of the series (``introduced_index``) fails only on the
    stages from that patch until the fix, and passes before it too.
    """
    return FAIL if introduced_index <= stage < fix_index else PASS


def _tested_file(nodeid: str) -> str:
    """The installed path of the upstream file a test's directory tests (the executor by default)."""
    for f in pins.UPSTREAM_FILES:
        if nodeid.startswith(f.tests_dir + "/"):
            return f.package_path
    return pins.PACKAGE_PATH


def _marked_lines(record: Path) -> dict[str, list[str]]:
    """nodeid -> the lines its ``fixed_by(..., lines=...)`` names, from a collection record."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    return {n: r["lines"] for n, r in data.items() if isinstance(r, dict) and r.get("lines")}


def evaluate(
    outcomes: Mapping[int, Mapping[str, str]],
    fixed_by: Mapping[str, str | None],
    series: Sequence[str],
    introduced_by: Mapping[str, str] | None = None,
    upstream: frozenset[str] = frozenset(),
    elsewhere: Collection[str] = (),
) -> Evaluation:
    """Compare per-stage outcomes (stage -> nodeid -> outcome) with the expectations.

    ``upstream``: patches the line's base already carries; the tests they fix pass everywhere.
    ``elsewhere``: tests of a bug this line does not have (``fixed_by(..., lines=...)``): they pass.
    """
    stages = sorted(outcomes)
    ev = Evaluation(stages, fixed_by=dict(fixed_by))
    introduced_by = introduced_by or {}
    for nodeid in sorted(fixed_by):
        patch = fixed_by[nodeid]
        if patch is None or patch not in series:
            ev.errors.append(f"{nodeid}: fixed_by({patch!r}) names a patch not in patches/series")
            continue
        index = list(series).index(patch) + 1
        introduced = 0
        if nodeid in introduced_by:
            cause = introduced_by[nodeid]
            if cause not in series or list(series).index(cause) + 1 >= index:
                ev.errors.append(f"{nodeid}: introduced_by({cause!r}) is not a patch before {patch}")
                continue
            introduced = list(series).index(cause) + 1
        ev.introduced_by[nodeid] = introduced
        if nodeid in elsewhere:
            ev.elsewhere.add(nodeid)
            ev.rows[nodeid] = {k: Cell(outcomes[k].get(nodeid, MISSING), PASS) for k in stages}
            continue
        if patch in upstream:
            ev.rows[nodeid] = {k: Cell(outcomes[k].get(nodeid, MISSING), PASS, True) for k in stages}
            continue
        ev.rows[nodeid] = {
            k: Cell(outcomes[k].get(nodeid, MISSING), expected_outcome(k, index, introduced)) for k in stages
        }
    return ev


def render(title: str, ev: Evaluation, series: Sequence[str]) -> str:
    rows = [[title, "fixed by", *(str(k) for k in ev.stages)]]
    for nodeid, row in ev.rows.items():
        patch = ev.fixed_by.get(nodeid) or "?"
        short = patch.split("-", 1)[0]
        if ev.introduced_by.get(nodeid):
            short = f"{ev.introduced_by[nodeid]:04d}>{short}"
        if any(c.upstream for c in row.values()):
            short += " up"
        if nodeid in ev.elsewhere:
            short += " -"
        rows.append([re.sub(r"^tests/executor/", "", nodeid), short, *(row[k].label() for k in ev.stages)])
    lines = table.render(rows, widths=[0, 8, *(5 for _ in ev.stages)])
    if any(c.outcome == CANNOT_RUN for row in ev.rows.values() for c in row.values()):
        lines.append("n/a = cannot run on that stage (it lacks an executor attribute the test drives)")
    if any(c.upstream for row in ev.rows.values() for c in row.values()):
        lines.append("up = the line's base already carries the fixing patch: expected to pass on every stage")
    if ev.elsewhere:
        lines.append(
            "- = a bug of other lines only (fixed_by lines=...): must pass here, run on the final stage"
        )
    if any(c.outcome == NOT_RUN for row in ev.rows.values() for c in row.values()):
        lines.append(". = before the stage preceding the test's patch: not run (--every-stage runs them all)")
    if any(c.outcome == FLAKY for row in ev.rows.values() for c in row.values()):
        lines.append("pass* = failed, then passed when run again at once (see the stage-K-rerun logs)")
    if any(c.outcome == FLAKY_FAIL for row in ev.rows.values() for c in row.values()):
        lines.append("FAIL* = passed where the bug should show, then reproduced it when run again at once")
    return "\n".join(ln.rstrip() for ln in lines)


def _should_pass(
    nodeid: str,
    stage: int,
    fixed: Mapping[str, str | None],
    introduced: Mapping[str, str],
    series: Sequence[str],
    upstream: frozenset[str] = frozenset(),
) -> bool:
    patch = fixed.get(nodeid)
    if patch is None or patch not in series:
        return False
    if patch in upstream:
        return True
    cause = introduced.get(nodeid)
    start = list(series).index(cause) + 1 if cause is not None and cause in series else 0
    return expected_outcome(stage, list(series).index(patch) + 1, start) == PASS


def edge_stages(final: int, fix_index: int, introduced_index: int = 0, upstream: bool = False) -> set[int]:
    """
    The stages that decide a test's verdict: the one before its patch, and every one from its patch on.

    Earlier stages would only fail again. A bug the series introduced starts from the stage before the
    patch that introduced it; a patch the line's base carries is tested on every stage.
    """
    if upstream:
        return set(range(final + 1))
    first = introduced_index - 1 if introduced_index else fix_index - 1
    return set(range(max(0, first), final + 1))


def plan_stages(
    fixed: Mapping[str, str | None],
    introduced: Mapping[str, str],
    series: Sequence[str],
    final: int,
    upstream: frozenset[str] = frozenset(),
) -> dict[str, set[int]]:
    """Test -> the stages it runs on; one naming no patch of the series runs nowhere (evaluate says why)."""
    plan: dict[str, set[int]] = {}
    for nodeid, patch in fixed.items():
        if patch is None or patch not in series:
            plan[nodeid] = set()
            continue
        cause = introduced.get(nodeid)
        start = list(series).index(cause) + 1 if cause is not None and cause in series else 0
        plan[nodeid] = edge_stages(final, list(series).index(patch) + 1, start, patch in upstream)
    return plan


def parse_stage_range(text: str | None, final: int) -> list[int]:
    if not text:
        return list(range(final + 1))
    m = re.fullmatch(r"(\d*)(-?)(\d*)", text.strip())
    if not m or not (m.group(1) or m.group(3)):
        raise ToolError(f"--stage-range wants K, A-B, A- or -B, not {text!r}")
    lo = int(m.group(1)) if m.group(1) else 0
    hi = int(m.group(3)) if m.group(3) else (final if m.group(2) else lo)
    if not 0 <= lo <= hi <= final:
        raise ToolError(f"--stage-range {text} is outside stages 0..{final}")
    return list(range(lo, hi + 1))


TEST_DIRS = tuple(f.tests_dir for f in pins.UPSTREAM_FILES)


def run_stage(
    python: Path,
    sources: Mapping[str, bytes],
    out_dir: Path,
    tag: str,
    select: str | None,
    layout_root: Path,
    nodeids: Sequence[str] = TEST_DIRS,
    collect_only: bool = False,
    marker: str | None = "fixed_by",
    plugins: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> tuple[dict[str, str], dict[str, str | None], dict[str, str], str | None]:
    """Run the marked tests against one stage: (outcomes, fixed_by, introduced_by, error or None).

    ``layout_root`` is pytest's working directory, where ``nodeids`` are (``verify --own-tests``
    passes a stage's own test tree, ``marker=None`` to run every test in it, its own ``plugins``).
    """
    venvs.install_sources(python, sources)
    nodeids = [n for n in nodeids if (layout_root / n.split("::")[0]).exists()]
    out_dir.mkdir(parents=True, exist_ok=True)
    record = out_dir / f"{tag}.json"
    record.unlink(missing_ok=True)
    cmd = [
        str(python), "-m", "pytest", *nodeids, "-p", "no:cacheprovider",
        "-p", "tools.engine.fixed_by_plugin", f"--junitxml={out_dir / f'{tag}.xml'}", "-q", "-rN",
    ]  # fmt: skip
    if marker:
        cmd += ["-m", marker]
    for plugin in plugins:
        cmd += ["-p", plugin]
    if select:
        cmd += ["-k", select]
    cmd += extra_args
    if collect_only:
        cmd.append("--collect-only")
    with tempfile.TemporaryDirectory(prefix="lepatch-airflow-home-") as home:
        env = venvs.test_env(Path(home))
        env.update(extra_env or {})
        env[RECORD_ENV] = str(record)
        proc = subprocess.run(cmd, cwd=layout_root, env=env, capture_output=True, text=True, check=False)
    (out_dir / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    error = None
    if proc.returncode not in (0, 1, 5) or not record.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["(no output)"]
        error = f"pytest exited {proc.returncode}: {tail[0]} (log: {out_dir / f'{tag}.log'})"
    data: dict[str, dict[str, Any]] = json.loads(record.read_text()) if record.exists() else {}
    outcomes = {n: r["outcome"] for n, r in data.items() if "outcome" in r}
    fixed = {n: r.get("fixed_by") for n, r in data.items() if "fixed_by" in r}
    introduced = {n: r["introduced_by"] for n, r in data.items() if "introduced_by" in r}
    return outcomes, fixed, introduced, error


def _verify_line(
    res: engine_mod.LineResult,
    series: list[str],
    layout: Layout,
    stage_range: str | None,
    select: str | None,
    out: Any,
    every_stage: bool = False,
) -> tuple[Evaluation, list[int]]:
    name = res.line.name
    python = venvs.ensure(res.line, layout)
    stages = parse_stage_range(stage_range, res.final)
    out_dir = layout.build / "verify" / name
    outcomes: dict[int, dict[str, str]] = {}
    errors: list[str] = []
    upstream = res.upstream
    # Which tests exist and what each is marked with, before anything runs (collection is cheap).
    _, fixed_by, introduced_by, error = run_stage(
        python, res.sources(), out_dir, "collect", select, layout.root, collect_only=True
    )
    if error:
        errors.append(f"{name} collection: {error}")
    # Tests of a bug only other lines have (``fixed_by(..., lines=...)``): here they must pass, on the
    # final stage (earlier stages have nothing to show).
    elsewhere = {n for n, lines in _marked_lines(out_dir / "collect.json").items() if name not in lines}
    if every_stage:
        plan = {nodeid: set(stages) for nodeid in fixed_by}
    else:
        plan = plan_stages(fixed_by, introduced_by, series, res.final, upstream)
    plan.update({n: {res.final} & set(stages) for n in elsewhere})
    # (upstream file, its sha256) -> the first stage run with it. A test runs the upstream file its
    # directory tests (the executor's tests replace the task runner: no supervisor runs in them), so on
    # a stage whose file is byte-identical to one already run (3.4's stages 0-3 are its base; the
    # executor of the supervisor patch's stage is the stage before's) its outcome is that stage's.
    ran: dict[tuple[str, bytes], int] = {}
    digest = {k: {p: hashlib.sha256(d).digest() for p, d in res.sources(k).items()} for k in stages}
    try:
        for k in stages:
            wanted = sorted(n for n, planned in plan.items() if k in planned)
            got = {n: NOT_RUN for n in plan if n not in wanted}
            same = None
            for n in wanted:
                path = _tested_file(n)
                earlier = ran.get((path, digest[k].get(path, b"")))
                if earlier is not None and outcomes[earlier].get(n, NOT_RUN) != NOT_RUN:
                    got[n] = outcomes[earlier][n]
                    same = earlier
            if k == res.final and (reused := final_record.passed(name, res.sources(k), layout) & set(wanted)):
                got.update(dict.fromkeys(reused, PASS))
                print(
                    f"{name} stage {k}: {len(reused)} passed in `nox -s tests` on this code, reused", file=out
                )
            todo = [n for n in wanted if n not in got]
            if not todo:
                outcomes[k] = got
                if not wanted:
                    why = "no test is decided there"
                elif same is not None:
                    why = f"the tested code of stage {same}, not run again"
                else:
                    why = "nothing left to run"
                print(f"{name} stage {k}: {why}", file=out, flush=True)
                continue
            for path, data in digest[k].items():
                ran.setdefault((path, data), k)
            started = time.monotonic()
            result, fixed, introduced, error = run_stage(
                python, res.sources(k), out_dir, f"stage-{k}", select, layout.root, todo
            )
            fixed_by.update(fixed)
            introduced_by.update(introduced)
            if error:
                errors.append(f"{name} stage {k}: {error}")
            again = [
                n
                for n, o in result.items()
                if o in (FAIL, ERROR) and _should_pass(n, k, fixed_by, introduced_by, series, upstream)
            ]
            unreproduced = [
                n
                for n, o in result.items()
                if o == PASS
                and n in fixed_by
                and not _should_pass(n, k, fixed_by, introduced_by, series, upstream)
            ]
            if (again or unreproduced) and not error:
                rerun, *_ = run_stage(
                    python,
                    res.sources(k),
                    out_dir,
                    f"stage-{k}-rerun",
                    None,
                    layout.root,
                    again + unreproduced,
                )
                result.update({n: FLAKY for n in again if rerun.get(n) == PASS})
                result.update({n: FLAKY_FAIL for n in unreproduced if rerun.get(n) in (FAIL, CANNOT_RUN)})
            got.update(result)
            outcomes[k] = got
            counts = {o: list(result.values()).count(o) for o in (PASS, FLAKY, FAIL, CANNOT_RUN, ERROR, SKIP)}
            summary = ", ".join(f"{v} {o}" for o, v in counts.items() if v) or "no tests ran"
            print(f"{name} stage {k}: {summary} ({time.monotonic() - started:.1f} s)", file=out, flush=True)
    finally:
        # why: the venv is shared with the tests session; leave it on the final overlay.
        venvs.install_sources(python, res.sources())
    ev = evaluate(outcomes, fixed_by, series, introduced_by, upstream, elsewhere)
    ev.errors.extend(errors)
    return ev, stages


def applied_lines(
    engine: engine_mod.Engine, lines: Sequence[pins.Line | str] | None, allow_drift: bool
) -> tuple[dict[str, engine_mod.LineResult], list[str]]:
    """Every line's stages and the test files' drift, refused when a patch fails or (unless allowed) drift."""
    results = engine.apply_all(lines)
    failed = [p for r in results.values() for p in r.patches if p.status == engine_mod.FAILED]
    if failed:
        raise ToolError(f"{failed[0].detail}\n{failed[0].hint}")
    drift = [d for d in engine.drift(results) if any(f"{t}/" in d for t in TEST_DIRS)]
    if drift and not allow_drift:
        raise ToolError(f"{drift[0]}; run `nox -s apply -- --write` first (or pass --allow-drift)")
    return results, drift


def run_verify(
    engine: engine_mod.Engine,
    lines: Sequence[Line | str] | None = None,
    stage_range: str | None = None,
    select: str | None = None,
    allow_drift: bool = False,
    jobs: int = 1,
    out: Any = sys.stdout,
    every_stage: bool = False,
) -> int:
    layout = engine.layout
    marked = [m for m in fixed_by_markers(layout, engine.series) if m[0].startswith("tests/")]
    if not marked:
        print("verify: tests/executor has no test marked fixed_by yet: nothing to verify", file=out)
        return 0
    results, _ = applied_lines(engine, lines, allow_drift)
    series = engine.series.names
    for res in results.values():
        venvs.ensure(res.line, layout)  # sequentially: uv shares its cache between them
    # why: each line has its own venv, so lines can run side by side (--jobs 2 on 2 cores).
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {
            name: pool.submit(_verify_line, res, series, layout, stage_range, select, out, every_stage)
            for name, res in results.items()
        }
        evaluations = {name: f.result() for name, f in futures.items()}
    report: dict[str, Any] = {"series": series, "lines": {}}
    ok = True
    for name, (ev, stages) in evaluations.items():
        print(render(results[name].line.label, ev, series), file=out)
        for e in ev.errors:
            print(f"error: {e}", file=out)
        ok &= ev.ok
        report["lines"][name] = {
            "version": results[name].line.version,
            "stages": stages,
            "errors": ev.errors,
            "tests": {
                nodeid: {
                    "fixed_by": ev.fixed_by.get(nodeid),
                    "introduced_by_stage": ev.introduced_by.get(nodeid) or None,
                    "cells": {
                        str(k): {"outcome": c.outcome, "expected": c.expected, "unexpected": c.unexpected}
                        for k, c in row.items()
                    },
                }
                for nodeid, row in ev.rows.items()
            },
        }
    report["ok"] = ok
    path = layout.build / "verify.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    unexpected = sum(
        c.unexpected for ev, _ in evaluations.values() for row in ev.rows.values() for c in row.values()
    )
    print(f"verify: {'ok' if ok else 'FAILED'} ({unexpected} unexpected cell(s); {path})", file=out)
    return 0 if ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    return run_verify(
        engine_mod.default_engine(),
        args.line,
        args.stage_range,
        args.k,
        args.allow_drift,
        args.jobs,
        every_stage=args.every_stage,
    )


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("verify", help="run each fixed_by test on the stages that decide it, on every line")
    p.add_argument("--line", action="append", type=pins.line_arg, help="only this line (repeatable)")
    p.add_argument("--stage-range", help="K, A-B, A- or -B (default: every stage)")
    p.add_argument("-k", help="pytest -k expression, passed through")
    p.add_argument("--jobs", type=int, default=1, help="lines run side by side (default 1)")
    p.add_argument("--allow-drift", action="store_true", help="run even if tests/executor drifted")
    p.add_argument(
        "--every-stage", action="store_true", help="every test on every stage, not only its edge stages"
    )
    p.set_defaults(func=_cmd_verify)

"""``verify --own-tests``: each stage's own test files pass on that stage, on every line.

``verify`` runs the final test files (``tests/executor``, derived from the whole series) against
each stage's code, so a test file as a patch left it never runs on the patch's own commit. An
upstream PR's CI runs exactly that: the commit's code with the commit's tests. This mode builds,
for each line and each stage k from the first patch of our own, stage k's test tree (the files the
series has put under ``airflow-core/tests/unit/executors/local_executor/``, task-sdk's
``task-sdk/tests/task_sdk/execution_time/`` and the API server's
``airflow-core/tests/unit/api_fastapi/auth/managers/`` by then, derived to ``tests/executor``,
``tests/supervisor`` and ``tests/api_server`` as ``apply`` derives the final ones) into
``build/own-tests/<line>/stage-<k>/``, installs stage k's upstream files into the line's venv and
runs every test of that tree there. Every one must pass (or skip); a failure is rerun once at
once, and one that passes then is shown as flaky (``pass*``), as verify does.

The first stage is that of the first patch whose ``Origin`` is not ``backport`` or ``upstream``
(today patch 4, an upstream draft, ``Origin: other``): the backports are upstream's merged commits,
tested by upstream's CI as they were merged (3.4's base carries them), while every later patch is a
commit this series authors and cherry-picks (``nox -s backport``), or folds into a PR (``nox -s pr``
folds 4-6 into 7). ``--stage-range`` overrides it (``0-`` runs every stage).

Scenarios run under fork only unless ``LEPATCH_START_METHODS`` says otherwise
(``tools.engine.start_method_plugin`` applies it to test files older than the conftest that reads
it). Every test is bounded: the harness's watchdog kills a stuck scenario, pytest-timeout (the
project's ``pyproject.toml``, copied beside the tree) any other test. On the final stage the tests
that passed in ``nox -s tests`` on the same code and tests are not run again
(``tools.engine.final_record``), and a test directory whose files and tested upstream file an
earlier stage had takes that stage's outcomes (``dir_keys``). ``--jobs`` stages run side by
side, the latest first, each in a venv of its own (the line's, or a copy of it:
``build/venvs/<line>-copyN``). It prints a
stage x line table and the failing node ids, writes ``build/verify-own-tests.json`` and exits 1 on
any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.engine import apply as engine_mod
from tools.engine import final_record, venvs
from tools.engine.verify import (
    CANNOT_RUN,
    ERROR,
    FAIL,
    FLAKY,
    MISSING,
    PASS,
    SKIP,
    TEST_DIRS,
    applied_lines,
    parse_stage_range,
    run_stage,
)
from tools.shared import pins
from tools.shared.layout import Layout

# Origins whose patch is upstream's own merged commit (DEP-3: "backport, <url>", "upstream, <url>").
UPSTREAM_ORIGINS = ("backport", "upstream")
DEFAULT_START_METHODS = "fork"
PLUGIN = "tools.engine.start_method_plugin"
REPORT = "verify-own-tests.json"
BAD = (FAIL, ERROR, CANNOT_RUN, MISSING)


def origin_kind(origin: str | None) -> str:
    """``backport`` of ``backport, https://...``; ``vendor`` of ``vendor``; empty when missing."""
    return (origin or "").split(",", 1)[0].strip().lower()


def first_own_stage(origins: Sequence[str | None]) -> int:
    """The stage of the first patch (1-based) not upstream's own commit; past the last if none is."""
    for index, origin in enumerate(origins, 1):
        if origin_kind(origin) not in UPSTREAM_ORIGINS:
            return index
    return len(origins) + 1


def plan(finals: Mapping[str, int], first: int, stage_range: str | None) -> dict[str, list[int]]:
    """Line -> the stages to run: ``first``..final, or ``stage_range`` where one is given."""
    if stage_range:
        return {line: parse_stage_range(stage_range, final) for line, final in finals.items()}
    return {line: list(range(first, final + 1)) for line, final in finals.items()}


def dir_keys(sources: Mapping[str, bytes], tests: Mapping[str, bytes]) -> dict[str, str]:
    """Test directory -> one value for what running it means: its files and the upstream file it tests.

    A directory runs the upstream file it tests only (the executor's tests replace the task runner:
    no supervisor runs in them, as verify relies on too), so a stage that changes neither runs it as
    an earlier stage did. Directories with no ``test_*.py`` are left out.
    """
    keys = {}
    for f in pins.UPSTREAM_FILES:
        prefix = f.tests_dir + "/"
        files = {rel: data for rel, data in tests.items() if rel.startswith(prefix)}
        if not any(Path(rel).name.startswith("test_") for rel in files):
            continue
        digest = hashlib.sha256(f.package_path.encode() + b"\0" + sources.get(f.package_path, b"-"))
        for rel in sorted(files):
            digest.update(b"\0" + rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
        keys[f.tests_dir] = digest.hexdigest()
    return keys


def split_dirs(
    keys_by_stage: Mapping[int, Mapping[str, str]],
) -> tuple[dict[int, list[str]], dict[int, dict[str, int]]]:
    """Per stage, the test directories to run there and those whose outcomes an earlier stage gives."""
    run: dict[int, list[str]] = {}
    borrow: dict[int, dict[str, int]] = {}
    seen: dict[str, int] = {}
    for k in sorted(keys_by_stage):
        run[k], borrow[k] = [], {}
        for d, key in keys_by_stage[k].items():
            if key in seen:
                borrow[k][d] = seen[key]
            else:
                seen[key] = k
                run[k].append(d)
    return run, borrow


@dataclass
class StageRun:
    """The outcome of one stage's own tests on one line."""

    line: str
    stage: int
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""  # "no test files", "as stage 5", "12 reused from nox -s tests"

    @property
    def failures(self) -> list[str]:
        return sorted(n for n, o in self.outcomes.items() if o in BAD)

    @property
    def flaky(self) -> list[str]:
        return sorted(n for n, o in self.outcomes.items() if o == FLAKY)

    def count(self, *kinds: str) -> int:
        return sum(o in kinds for o in self.outcomes.values())

    @property
    def ok(self) -> bool:
        return not self.errors and not self.failures

    def label(self) -> str:
        """The table's cell: ``41 ok``, ``30/41 FAIL``, ``ERR``."""
        if self.errors and not self.outcomes:
            return "ERR"
        passed, total = self.count(PASS, FLAKY, SKIP), len(self.outcomes)
        if not total:
            return "none" if not self.errors else "ERR"
        text = f"{passed} ok" if self.ok else f"{passed}/{total} FAIL"
        if self.flaky:
            text += "*"
        return text + ("!" if self.errors and self.outcomes else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.count(PASS),
            "flaky": self.flaky,
            "skipped": self.count(SKIP),
            "failed": self.failures,
            "errors": self.errors,
            "seconds": round(self.seconds, 1),
            "note": self.note,
            "ok": self.ok,
        }


def evaluate(outcomes: Mapping[str, str], rerun: Mapping[str, str]) -> dict[str, str]:
    """The stage's outcomes with a failure that passed when run again at once shown as flaky."""
    out = dict(outcomes)
    for nodeid, outcome in outcomes.items():
        if outcome in BAD and rerun.get(nodeid) == PASS:
            out[nodeid] = FLAKY
    return out


def render(runs: Mapping[str, Mapping[int, StageRun]]) -> str:
    """Stage x line: each cell the stage's own tests on that line, then every failing node id."""
    lines = list(runs)
    stages = sorted({k for by_stage in runs.values() for k in by_stage})
    width = max([12, *(len(r.label()) + 2 for by_stage in runs.values() for r in by_stage.values())])
    out = ["stage  " + "".join(ln.ljust(width) for ln in lines)]
    for k in stages:
        cells = [runs[ln][k].label() if k in runs[ln] else "-" for ln in lines]
        out.append(f"{k:<5}  " + "".join(c.ljust(width) for c in cells))
    notes = []
    for ln in lines:
        for k, run in sorted(runs[ln].items()):
            for nodeid in run.failures:
                notes.append(f"FAIL {ln} stage {k}: {nodeid} ({run.outcomes[nodeid]})")
            for nodeid in run.flaky:
                notes.append(f"pass* {ln} stage {k}: {nodeid} (failed, then passed when run again)")
            for error in run.errors:
                notes.append(f"error {ln} stage {k}: {error}")
    legend = "N ok = every test of the stage's own files passed or skipped; P/T FAIL = P of T passed"
    if any(r.flaky for by_stage in runs.values() for r in by_stage.values()):
        legend += "; * = a test passed only when run again"
    return "\n".join(ln.rstrip() for ln in [*out, legend, *notes])


def write_tree(tests: Mapping[str, bytes], dest: Path, layout: Layout) -> Path:
    """The stage's derived tests under ``dest`` (``tests/executor/...``), with the project's pytest config."""
    if dest.exists():
        shutil.rmtree(dest)
    for rel, data in tests.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(layout.root / "pyproject.toml", dest / "pyproject.toml")
    return dest


def schedule(stages: Mapping[str, Sequence[int]]) -> list[tuple[str, int]]:
    """The order stages start in: the latest first (they carry the most tests), lines interleaved."""
    order = list(stages)
    return sorted(((ln, k) for ln in order for k in stages[ln]), key=lambda t: (-t[1], order.index(t[0])))


def _run_stage(
    res: engine_mod.LineResult,
    k: int,
    python: Path,
    layout: Layout,
    select: str | None,
    final_dirs: Sequence[str],
    env: Mapping[str, str],
    out: Any,
    test_dirs: Sequence[str] = TEST_DIRS,
) -> StageRun:
    """Run stage ``k``'s own tests in ``test_dirs`` (those whose outcome no earlier stage gives).

    ``final_dirs``: the test directories whose files and tested code are the final stage's, where
    what passed in ``nox -s tests`` (on the final overlay and today's tests) is not run again.
    """
    name = res.line.name
    out_dir = layout.build / "verify-own" / name
    run = StageRun(name, k)
    started = time.monotonic()
    tree = write_tree(res.derived_tests(k), layout.build / "own-tests" / name / f"stage-{k}", layout)
    reused: set[str] = set()
    if same_as_final := [d for d in test_dirs if d in final_dirs]:
        passed = final_record.passed(name, res.sources(), layout)
        reused = {n for n in passed if n.startswith(tuple(d + "/" for d in same_as_final))}
    todo = True
    if reused:
        _, _, _, error = run_stage(
            python, res.sources(k), out_dir, f"stage-{k}-collect", select, tree, test_dirs,
            collect_only=True, marker=None, plugins=[PLUGIN], extra_env=env,
        )  # fmt: skip
        collected = json.loads((out_dir / f"stage-{k}-collect.json").read_text()) if not error else {}
        reused &= set(collected)
        todo = bool(set(collected) - reused)
    outcomes: dict[str, str] = dict.fromkeys(reused, PASS)
    if todo:
        deselect = [arg for n in sorted(reused) for arg in ("--deselect", n)]
        result, _, _, error = run_stage(
            python, res.sources(k), out_dir, f"stage-{k}", select, tree, test_dirs,
            marker=None, plugins=[PLUGIN], extra_env=env, extra_args=deselect,
        )  # fmt: skip
        if error:
            run.errors.append(error)
        outcomes.update(result)
        again = sorted(n for n, o in result.items() if o in BAD)
        if again and not error:
            rerun, *_ = run_stage(
                python, res.sources(k), out_dir, f"stage-{k}-rerun", None, tree, again,
                marker=None, plugins=[PLUGIN], extra_env=env,
            )  # fmt: skip
            outcomes = evaluate(outcomes, rerun)
    run.outcomes = outcomes
    run.seconds = time.monotonic() - started
    if reused:
        run.note = f"{len(reused)} passed in `nox -s tests` on the same code and tests, reused"
    counts = f"{run.count(PASS, FLAKY)} passed, {len(run.failures)} failed, {run.count(SKIP)} skipped"
    extra = f"; {run.note}" if run.note else ""
    print(f"{name} stage {k}: {counts} ({run.seconds:.1f} s{extra})", file=out, flush=True)
    return run


def run_own_tests(
    engine: engine_mod.Engine,
    lines: Sequence[str] | None = None,
    stage_range: str | None = None,
    select: str | None = None,
    allow_drift: bool = False,
    jobs: int = 1,
    out: Any = sys.stdout,
) -> int:
    layout = engine.layout
    results, drift = applied_lines(engine, lines, allow_drift)
    series = engine.series
    first = first_own_stage([p.field("Origin") if p else None for p in map(series.patches.get, series.names)])
    stages = plan({name: res.final for name, res in results.items()}, first, stage_range)
    methods = os.environ.get("LEPATCH_START_METHODS") or DEFAULT_START_METHODS
    env = {"LEPATCH_START_METHODS": methods}
    print(
        f"verify --own-tests: stages {stage_range or f'{first}-'} (the first patch not a backport: "
        f"{series.names[first - 1] if first <= len(series.names) else 'none'}); start methods {methods}",
        file=out,
        flush=True,
    )
    # A test directory whose files and tested code an earlier stage had runs there only (3.1's stage 11
    # has no file to change; stages 10 and 11 change no executor test).
    runs: dict[str, dict[int, StageRun]] = {name: {} for name in results}
    todo: dict[str, list[int]] = {}
    dirs: dict[tuple[str, int], list[str]] = {}
    borrowed: dict[tuple[str, int], dict[str, int]] = {}
    final_dirs: dict[tuple[str, int], list[str]] = {}
    for name, res in results.items():
        keys = {k: dir_keys(res.sources(k), res.derived_tests(k)) for k in stages[name]}
        final_keys = dir_keys(res.sources(), res.derived_tests())
        for k in stages[name]:
            # why not with drift: the tests session's record is of the test files in this repository
            final_dirs[(name, k)] = [] if drift else [d for d, v in keys[k].items() if final_keys.get(d) == v]
        run_dirs, borrow = split_dirs(keys)
        for k in stages[name]:
            dirs[(name, k)], borrowed[(name, k)] = run_dirs[k], borrow[k]
            if run_dirs[k]:
                todo.setdefault(name, []).append(k)
    # why copies: a venv holds one stage's files at a time; ``jobs`` stages of a line side by side
    # need as many venvs (made sequentially: uv shares its cache between them).
    jobs = max(1, jobs)
    slots: dict[str, queue.Queue[Path]] = {}
    for name, ks in todo.items():
        slots[name] = queue.Queue()
        for copy in range(min(jobs, len(ks))):
            slots[name].put(venvs.ensure(results[name].line, layout, copy=copy))

    def one(name: str, k: int) -> StageRun:
        python = slots[name].get()
        try:
            final = final_dirs[(name, k)]
            return _run_stage(results[name], k, python, layout, select, final, env, out, dirs[(name, k)])
        finally:
            slots[name].put(python)

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {task: pool.submit(one, *task) for task in schedule(todo)}
            for (name, k), future in futures.items():
                runs[name][k] = future.result()
    finally:
        # why: the line's own venv is shared with the tests session and verify; leave it on the final
        # overlay (the copies are this mode's alone).
        for name in todo:
            venvs.install_sources(venvs.ensure(results[name].line, layout), results[name].sources())
    for (name, k), taken in borrowed.items():
        run = runs[name].setdefault(k, StageRun(name, k))
        for d, earlier in sorted(taken.items()):
            first_run = runs[name][earlier]
            run.outcomes.update({n: o for n, o in first_run.outcomes.items() if n.startswith(d + "/")})
            run.errors += [e for e in first_run.errors if e not in run.errors]
        if taken:
            since = ", ".join(f"{d} as stage {j}" for d, j in sorted(taken.items()))
            run.note = "; ".join(filter(None, [run.note, since]))
        if not taken and not dirs[(name, k)]:
            run.note = "no test files"
    runs = {name: dict(sorted(by.items())) for name, by in runs.items()}
    print(render(runs), file=out)
    ok = all(r.ok for by_stage in runs.values() for r in by_stage.values())
    report = {
        "series": series.names,
        "first_own_stage": first,
        "start_methods": methods,
        "seconds": round(time.monotonic() - started, 1),
        "lines": {name: {str(k): r.to_json() for k, r in by.items()} for name, by in runs.items()},
        "ok": ok,
    }
    path = layout.build / REPORT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    bad = sum(len(r.failures) + len(r.errors) for by_stage in runs.values() for r in by_stage.values())
    print(f"verify --own-tests: {'ok' if ok else 'FAILED'} ({bad} failure(s); {path})", file=out)
    return 0 if ok else 1


def _cmd_own_tests(args: argparse.Namespace) -> int:
    return run_own_tests(
        engine_mod.default_engine(), args.line, args.stage_range, args.k, args.allow_drift, args.jobs
    )


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``verify --own-tests``: an option of verify's parser (registered after it), this mode when given."""
    verify = sub.choices["verify"]
    plain = verify.get_default("func")
    verify.add_argument(
        "--own-tests",
        action="store_true",
        help="each stage's own test files on that stage, from the first patch of our own (docs/verify.md)",
    )
    verify.set_defaults(func=lambda args: _cmd_own_tests(args) if args.own_tests else plain(args))

"""``python -m tools model``: SPIN model checks of the dispatch protocol, final stage and stages 0 and 3.

The models (``model/*.pml``, Promela) are of the protocol between the LocalExecutor and its workers:

- ``final.pml``: the overlay (patches 7 to 10): a pipe pair per worker and no queue of the executor's
  own: workloads wait in BaseExecutor's queue (the scheduler's), each heartbeat hands over as many as
  there are open slots, and ``_process_workloads`` writes each whole to an idle worker before taking it
  from that queue; result frames written whole (each smaller than ``PIPE_BUF``) and read without
  blocking; death by waitid and ``_reap_workers``; one thread: the scheduler's, the only reader of
  results and writer of workloads, SIGTERM held off in ``_process_workloads``, ``_read_results`` and
  ``_worker_died`` and coming anywhere else (between the lines of ``_reap_workers`` too; then ``end()``),
  and the start acknowledgement: a workload whose worker died before starting it goes back to
  BaseExecutor's queue;
- ``shared.pml`` (through ``stage0.pml``/``stage3.pml``): one shared activity queue and one shared
  result queue with their locks; stage 3 drains the results once before each put.

What makes the real bugs is in all of them (``model/pipes.pml``): pipes of bounded capacity whose
writers block, space freed a page at a time, frames larger than the pipe written a page per step, one
worker process per slot (replaced when reaped), SIGKILL of any worker at any step, a lock held by a
killed process held for ever. The properties: no reachable state where the executor waits for ever
(SPIN's invalid end states: every wait loop of the executor is modelled as waiting for what would end
it, so a livelock shows as a deadlock); every dispatched workload ends exactly once as reported by the
worker that ran it, given back to the scheduler or re-dispatched never started, or failed because its
worker died (assertions); ``end()`` returns.

Each check is one row: a model, its bounds (``-D`` macros) and what SPIN must say. The final checks
must find nothing, exhaustively (one that found a race before its fix names the fix's regression test:
SIGTERM mid-dispatch); the stage 0 and 3 checks must find their deadlock (the check bites), each written
out as the real operations of its trail (``@op`` comments in the model; ``@wait`` says what a stuck
process waits for) and named after the regression test it reproduces. Rows marked "no test yet" report
what the model finds that no regression test covers; they do not decide the exit code.

Left out of the models: sizes are scaled (a pipe of 2 pages, not 16; sizes in half pages); in stages 0
and 3 a write of at most a page is not atomic-into-a-fresh-page as Linux makes it (the final model's
result frames are); EOF on a result pipe (a task process may hold it open: death is known by waitid
only); one key dispatched twice (resumed deferrals), connection tests, callbacks, ``revoke_task``, the
scheduler's own ``change_state``; priorities (all workloads of one: BaseExecutor's queue in insertion
order); the spawn start method; a signal inside ``end()`` and ``terminate()`` (and so ``end()``'s
``except``); a workload that fails to pickle; a workload that is not a task (no start acknowledgement).

The final model stands for ``airflow_overlay/3.3/airflow/executors/local_executor.py`` as it was when
the model was last reviewed: ``model/overlay.sha256`` records its hash, ``--check-hash`` fails once the
file changes, ``--rehash`` records the new hash after the model has been looked at again.

Nothing is installed here: ``spin`` and ``gcc`` must be on PATH (``nox -s model`` installs spin).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.shared import table
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

OVERLAY = "airflow_overlay/3.3/airflow/executors/local_executor.py"
HASH_FILE = "model/overlay.sha256"

# pan's own memory bound, in MiB: the largest final check needs about a sixth of it; a machine of 24 GiB
# shared by several jobs keeps plenty.
MEMORY_MB = 6144
MAX_DEPTH = 200_000

NONE = "none"
DEADLOCK = "deadlock"
ASSERTION = "assertion"


@dataclass(frozen=True)
class Check:
    """One SPIN run: a model file, its bounds, and the verdict it must reach."""

    name: str
    stage: str
    model: str
    defines: dict[str, int]
    # NONE: nothing may be found. DEADLOCK / ASSERTION: that kind of error must be found, with the
    # executor stuck at (or the assertion naming) ``where``.
    expect: str
    where: str = ""
    test: str = ""
    gating: bool = True

    def bounds(self) -> str:
        """The bounds in words; sizes in half pages (u), a pipe being 2 pages (4u, the real one 16)."""
        frames = {"W": 5, "R": 5} if self.model == "final.pml" else {"W": 2, "R": 2}
        d = {"N": 2, "K": 3, "KILLS": 0, "TERMS": 0, **frames, **self.defines}
        parts = [f"workers={d['N']}", f"workloads={d['K']}", f"wl={d['W']}u", f"result={d['R']}u", "pipe=4u"]
        parts.append(f"kills={d['KILLS']}" + (f"@{_phases(d['KILLMASK'])}" if "KILLMASK" in d else ""))
        if self.model == "final.pml":
            parts.append(f"sigterm={d['TERMS']}")
        return " ".join(parts)


def _phases(mask: int) -> str:
    names = ["idle", "read", "run", "write", "locks"]
    return "+".join(n for i, n in enumerate(names) if mask >> i & 1)


TESTS = "tests/executor/"
FINDING = "no test yet"
CHECKS: tuple[Check, ...] = (
    # Result frames are at most a page (R=2u): a worker writes each whole, in one write smaller than
    # PIPE_BUF. Workloads (W=5u) are larger than the model's pipe, written a page at a time.
    Check("final", "final", "final.pml", {"N": 2, "K": 2, "W": 5, "R": 2, "KILLS": 1, "TERMS": 1}, NONE),
    # Two kills, with and without a SIGTERM (end() while workers still run, which multiplies the states
    # about ninefold); with whole result frames both fit MEMORY_MB on two workloads.
    Check(
        "final/2 kills", "final", "final.pml", {"N": 2, "K": 2, "W": 5, "R": 2, "KILLS": 2, "TERMS": 0}, NONE
    ),
    Check(
        "final/2 kills, SIGTERM",
        "final",
        "final.pml",
        {"N": 2, "K": 2, "W": 5, "R": 2, "KILLS": 2, "TERMS": 1},
        NONE,
    ),
    Check(
        "final/3 workloads",
        "final",
        "final.pml",
        {"N": 2, "K": 3, "W": 5, "R": 2, "KILLS": 0, "TERMS": 1},
        NONE,
    ),
    Check(
        "0/full result pipe",
        "0",
        "stage0.pml",
        {"K": 6, "W": 2, "R": 2, "CHECK_END": 0},
        DEADLOCK,
        "activity_queue.put",
        "test_dispatch_deadlock.py::test_process_workloads_does_not_deadlock_on_a_full_result_pipe",
    ),
    Check(
        "0/kill read-lock holder",
        "0",
        "stage0.pml",
        {"K": 1, "KILLS": 1, "KILLMASK": 1, "CHECK_END": 0},
        ASSERTION,
        "(outcome[1]!=0)",
        "test_worker_death.py::test_workload_runs_after_worker_holding_read_lock_is_killed",
    ),
    Check(
        "0/kill mid-frame",
        "0",
        "stage0.pml",
        {"K": 2, "R": 5, "KILLS": 1, "KILLMASK": 8, "CHECK_END": 0},
        DEADLOCK,
        "result_queue.get()",
        "test_worker_death.py::test_worker_killed_mid_frame_fails_only_its_own_key",
    ),
    Check(
        "3/concurrent refill",
        "3",
        "stage3.pml",
        {"K": 3, "W": 5, "R": 5, "CHECK_END": 0},
        DEADLOCK,
        "activity_queue.put",
        "test_dispatch_deadlock.py::test_process_workloads_progresses_under_concurrent_result_refill",
    ),
    Check(
        "3/kill read-lock holder",
        "3",
        "stage3.pml",
        {"K": 1, "KILLS": 1, "KILLMASK": 1, "CHECK_END": 0},
        ASSERTION,
        "(outcome[1]!=0)",
        "test_worker_death.py::test_workload_runs_after_worker_holding_read_lock_is_killed",
    ),
    Check(
        "3/kill mid-frame",
        "3",
        "stage3.pml",
        {"K": 2, "R": 5, "KILLS": 1, "KILLMASK": 8, "CHECK_END": 0},
        DEADLOCK,
        "result_queue.get()",
        "test_worker_death.py::test_worker_killed_mid_frame_fails_only_its_own_key",
    ),
    # Races the model found that the first tests missed; each now has a regression test (patch 7 fixes both).
    Check(
        "0/shutdown pill race",
        "0",
        "stage0.pml",
        {"K": 1},
        DEADLOCK,
        'end() "proc.join()"',
        "test_shared_queue_races.py::test_end_does_not_lose_a_shutdown_message_to_an_idle_worker",
    ),
    Check(
        "3/shutdown pill race",
        "3",
        "stage3.pml",
        {"K": 1},
        DEADLOCK,
        'end() "while proc.is_alive()',
        "test_shared_queue_races.py::test_end_does_not_lose_a_shutdown_message_to_an_idle_worker",
    ),
    Check(
        "0/kill unread_messages holder",
        "0",
        "stage0.pml",
        {"K": 1, "KILLS": 1, "KILLMASK": 16, "CHECK_END": 0},
        DEADLOCK,
        "with self._unread_messages:",
        "test_shared_queue_races.py::test_a_process_killed_holding_a_shared_counter_lock_does_not_stop_dispatch",
    ),
    Check(
        "3/kill unread_messages holder",
        "3",
        "stage3.pml",
        {"K": 1, "KILLS": 1, "KILLMASK": 16, "CHECK_END": 0},
        DEADLOCK,
        "with self._unread_messages:",
        "test_shared_queue_races.py::test_a_process_killed_holding_a_shared_counter_lock_does_not_stop_dispatch",
    ),
    # Found by the model when the executor had a deque of its own (SystemExit inside or right after the
    # write undid a workload the worker had got whole); patch 9 fixes it: _process_workloads holds SIGTERM
    # off and takes a workload from BaseExecutor's queue only once it is written whole, so that undo is
    # gone by construction. One worker: workloads wait in BaseExecutor's queue throughout.
    # Found by the model on the redesign's first cut (issue 53): _reap_workers held nothing off, so a
    # SIGTERM between two of its lines left a worker half reaped: end() raised KeyError, or its key stayed
    # running for ever. Patch 9 holds the whole reap off.
    Check(
        "final/reap not held",
        "final",
        "final.pml",
        {"N": 2, "K": 2, "W": 5, "R": 2, "KILLS": 1, "TERMS": 1, "REAP_UNHELD": 1},
        ASSERTION,
        "hasout[",
        "test_exactly_once.py::"
        "test_sigterm_while_a_dead_worker_is_reaped_leaves_end_working_and_its_key_failed",
    ),
    Check(
        "final/SIGTERM mid-dispatch",
        "final",
        "final.pml",
        {"N": 1, "K": 3, "W": 5, "R": 2, "KILLS": 1, "TERMS": 1},
        NONE,
        test="test_exactly_once.py::"
        "test_sigterm_at_any_line_of_a_dispatch_leaves_each_workload_in_exactly_one_place",
    ),
)


@dataclass
class PanResult:
    """What pan printed: the counts a table row needs and the first error, if any."""

    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    errors: int = 0
    error: str = ""
    complete: bool = True
    problems: list[str] = field(default_factory=list)


_STORED = re.compile(r"^\s*(\d+) states, stored", re.M)
_TRANSITIONS = re.compile(r"^\s*(\d+) transitions \(= stored\+matched\)", re.M)
_ELAPSED = re.compile(r"^pan: elapsed time ([\d.e+]+) seconds", re.M)
_ERRORS = re.compile(r"errors: (\d+)")
_FIRST_ERROR = re.compile(r"^pan:1: (.*?)(?: \(at depth \d+\))?$", re.M)


def parse_pan(output: str) -> PanResult:
    """Read pan's report. A search cut short (depth or memory) is not complete: it proves nothing."""
    result = PanResult()
    if m := _STORED.search(output):
        result.states = int(m.group(1))
    if m := _TRANSITIONS.search(output):
        result.transitions = int(m.group(1))
    if m := _ELAPSED.search(output):
        result.seconds = float(m.group(1))
    if m := _ERRORS.search(output):
        result.errors = int(m.group(1))
    else:
        result.problems.append("pan printed no error count")
        result.complete = False
    if m := _FIRST_ERROR.search(output):
        result.error = m.group(1).strip()
    if "max search depth too small" in output:
        result.complete = False
        result.problems.append("search depth too small (raise MAX_DEPTH)")
    if "out of memory" in output or "pan: reached -DMEMLIM bound" in output:
        result.complete = False
        result.problems.append(f"out of memory (the bound is {MEMORY_MB} MiB)")
    return result


# What each assertion of the models means, by a piece of its expression as pan prints it.
ASSERTIONS = {
    "(outcome[1]!=0)": "a dispatched workload never ends",
    "outcome[k]==0": "a workload ends twice",
    "ranby[k]==0": "a workload given back or re-dispatched had already started",
    "ranby[k]==wpid[w]": "a result reported for a key its worker did not run",
    "ranby[n]==arr[n]": "a result reported for a key its worker did not run",
    "!(corrupt": "a worker read a frame made of two messages",
    "!(alive[w])": "a workload failed while its worker lives",
    "res_open==0": "two writers interleaved in one frame",
    "hasout[": "KeyError in end(): a worker left half reaped (gone from _outputs, still in workers)",
    "hasin[": "KeyError in end(): a worker left half reaped (gone from _inputs, still in workers)",
}


def describe(error: str) -> str:
    """The words for an error pan reports; the raw text when it is not one the models make."""
    if error.startswith("invalid end state"):
        return DEADLOCK
    return next((words for key, words in ASSERTIONS.items() if key in error), error)


def error_kind(error: str) -> str:
    if error.startswith("invalid end state"):
        return DEADLOCK
    if error.startswith("assertion violated"):
        return ASSERTION
    return error.split(" ")[0] if error else ""


@dataclass(frozen=True)
class Step:
    depth: int
    pid: int
    proc: str
    file: str
    line: int
    executed: bool


# Steps spin prints for its own control flow: no operation of the real code.
_CONTROL = {"[IF]", "[DO]", "[.(goto)]", "[else]", "[break]", "[(1)]"}
_STEP = re.compile(r"^\s*(\d+):\s+proc\s+(\d+)\s+\((\w+):\d+\)\s+(\S+?):(\d+)\s+\(state \d+\)(.*)$")


def parse_trail(text: str) -> tuple[list[Step], list[Step]]:
    """Split ``spin -t -p`` output into the executed steps and where each live process was left."""
    steps: list[Step] = []
    final: list[Step] = []
    after = False
    for raw in text.splitlines():
        if raw.startswith("#processes"):
            after = True
            continue
        m = _STEP.match(raw)
        if not m:
            continue
        rest = m.group(6).strip()
        step = Step(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4), int(m.group(5)), not after)
        if after:
            final.append(step)
        elif rest.startswith("[") and rest not in _CONTROL:
            steps.append(step)
    return steps, final


_KILLED = re.compile(r"^\s*SIGKILL pid (\d+)$", re.M)


def killed_pids(text: str) -> list[int]:
    """The workers the model's killer struck, in order (it prints each one's pid)."""
    return [int(pid) for pid in _KILLED.findall(text)]


def op_map(files: Iterable[Path], tag: str = "@op") -> dict[tuple[str, int], str]:
    """Comments tagged ``tag`` by (file name, line); a comment alone on its line names the next line.

    ``@op`` names the real operation a step stands for; ``@wait`` what a process stuck at that line
    (a blocking ``do`` or ``d_step``) waits for.
    """
    ops: dict[tuple[str, int], str] = {}
    for path in files:
        lines = path.read_text().splitlines()
        for i, text in enumerate(lines):
            if f"{tag} " not in text:
                continue
            op = text.split(f"{tag} ", 1)[1].split("*/", 1)[0].strip()
            target = i
            if not text.split("/*", 1)[0].strip():
                target = next((j for j in range(i + 1, len(lines)) if lines[j].strip()), i)
            ops[(path.name, target + 1)] = op
    return ops


def _who(step: Step) -> str:
    return "executor" if step.proc == "Executor" else f"worker p{step.pid}"


def _kill_text(op: str, victims: list[int]) -> str:
    return f"{op} worker p{victims.pop(0)}" if victims else op


def _bare(op: str) -> str:
    return op.removeprefix("executor: ").removeprefix("worker: ")


def render_trail(
    steps: Sequence[Step],
    final: Sequence[Step],
    ops: dict[tuple[str, int], str],
    waits: dict[tuple[str, int], str] | None = None,
    stuck: bool = True,
    killed: Sequence[int] = (),
) -> list[str]:
    """The trail as the real operations, repeats folded, then what every stuck process waits for.

    A step counts as a new operation only when its process comes to the line from another one and at
    another depth: the statements of one atomic step are one operation.
    """
    last_at: dict[int, tuple[str, int]] = {}
    seen: set[tuple[int, int, str]] = set()
    lines: list[tuple[str, str, int]] = []
    victims = list(killed)
    for step in steps:
        at = (step.file, step.line)
        again = last_at.get(step.pid) == at
        last_at[step.pid] = at
        op = ops.get(at)
        if op is None or again or (step.depth, step.pid, op) in seen:
            continue
        seen.add((step.depth, step.pid, op))
        if step.proc == "Killer":
            lines.append(("killer", _kill_text(op, victims), 1))
            continue
        who, op = _who(step), _bare(op)
        if lines and lines[-1][:2] == (who, op):
            lines[-1] = (who, op, lines[-1][2] + 1)
        else:
            lines.append((who, op, 1))
    out = [f"{who}: {op}" + (f" (x{n})" if n > 1 else "") for who, op, n in lines]
    for step in final:
        if step.proc == "Killer" or step.pid in killed:
            continue  # the killer waits for nothing; a killed worker is gone (its `unless` ends it)
        at = (step.file, step.line)
        wait, op = (waits or {}).get(at), ops.get(at)
        if stuck:
            out.append(f"  waits for ever: {_who(step)} in {_bare(wait or op or f'{step.file}:{step.line}')}")
        elif op or wait:
            # after an assertion only where a process was is of interest (a bare brace is not)
            out.append(f"  then: {_who(step)} at {_bare(op or wait or '')}")
    return out


@dataclass
class Outcome:
    check: Check
    pan: PanResult
    trail: list[str]
    ok: bool
    verdict: str


def judge(check: Check, pan: PanResult, trail: Sequence[str]) -> tuple[bool, str]:
    """Whether a run reached what its check requires, and the verdict for its table row."""
    if pan.problems:
        return False, "; ".join(pan.problems)
    kind = error_kind(pan.error)
    if pan.errors == 0:
        verdict = "none"
        return check.expect == NONE, verdict
    verdict = describe(pan.error)
    if check.expect == NONE:
        return False, verdict
    stuck = [line for line in trail if "waits for ever: executor" in line]
    if kind == DEADLOCK and stuck:
        verdict = f"deadlock: {stuck[0].split(' in ', 1)[1]}"
    if kind != check.expect:
        return False, verdict
    if check.expect == DEADLOCK:
        return any(check.where in line for line in stuck), verdict
    return check.where in pan.error, verdict


def find_tools() -> dict[str, str]:
    found = {name: shutil.which(name) for name in ("spin", "gcc")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise ToolError(
            f"model: {' and '.join(missing)} not found on PATH; `nox -s model` installs Debian's spin "
            "(apt-get install spin), gcc comes with build-essential"
        )
    return {name: path for name, path in found.items() if path is not None}


def _run(cmd: Sequence[str], cwd: Path, timeout: float | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0 and cmd[0] != "./pan":
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ToolError(
            f"model: `{' '.join(cmd)}` failed in {cwd} (exit {proc.returncode}): {' | '.join(tail)}"
        )
    return proc.stdout + proc.stderr


def run_check(check: Check, layout: Layout, tools: dict[str, str]) -> Outcome:
    """Generate, compile and run the verifier of one check in build/model/<check>/."""
    work = layout.build / "model" / re.sub(r"[^\w.-]+", "_", check.name)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    sources = sorted((layout.root / "model").glob("*.pml"))
    for src in sources:
        shutil.copy(src, work / src.name)
    defines = [f"-D{k}={v}" for k, v in check.defines.items()]
    _run([tools["spin"], "-a", *defines, check.model], work)
    # An exhaustive search is worth an optimised verifier; one that stops at the first error is not.
    opt = "-O2" if check.expect == NONE else "-O0"
    _run(
        [tools["gcc"], opt, "-w", "-DSAFETY", "-DCOLLAPSE", f"-DMEMLIM={MEMORY_MB}", "-o", "pan", "pan.c"],
        work,
    )
    started = time.monotonic()
    output = _run(["./pan", f"-m{MAX_DEPTH}", "-n"], work)
    (work / "pan.out").write_text(output)
    pan = parse_pan(output)
    if not pan.seconds:
        pan.seconds = time.monotonic() - started
    trail: list[str] = []
    if pan.errors and (work / f"{check.model}.trail").exists():
        text = _run([tools["spin"], "-t", "-p", *defines, check.model], work)
        (work / "trail.txt").write_text(text)
        steps, final = parse_trail(text)
        sources = sorted(work.glob("*.pml"))
        deadlock = error_kind(pan.error) == DEADLOCK
        trail = render_trail(
            steps, final, op_map(sources), op_map(sources, "@wait"), stuck=deadlock, killed=killed_pids(text)
        )
    ok, verdict = judge(check, pan, trail)
    return Outcome(check, pan, trail, ok, verdict)


def render_table(outcomes: Sequence[Outcome]) -> list[str]:
    rows = [("check", "bounds", "states", "time", "verdict", "")]
    for o in outcomes:
        marks = ("ok", "FAILED") if o.check.gating else ("found, no test", "not found")
        mark = marks[0] if o.ok else marks[1]
        rows.append(
            (o.check.name, o.check.bounds(), f"{o.pan.states:,}", f"{o.pan.seconds:.1f}s", o.verdict, mark)
        )
    return table.render(rows)


# --------------------------------------------------------------------------------------------------
# The overlay the final model stands for.
# --------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def overlay_hash_problems(layout: Layout = DEFAULT) -> list[str]:
    """One line per reason the final model may no longer describe the overlay; empty when it does."""
    overlay, record = layout.root / OVERLAY, layout.root / HASH_FILE
    if not overlay.is_file():
        return [f"{OVERLAY}: missing, so model/final.pml describes nothing"]
    if not record.is_file():
        return [f"{HASH_FILE}: missing; review model/final.pml, then run `python -m tools model --rehash`"]
    fields = record.read_text().split()
    if len(fields) != 2 or fields[1] != OVERLAY or not re.fullmatch(r"[0-9a-f]{64}", fields[0]):
        return [f"{HASH_FILE}: expected one line '<sha256>  {OVERLAY}'; run `python -m tools model --rehash`"]
    now = _sha256(overlay)
    if fields[0] != now:
        return [
            f"{OVERLAY} changed since model/final.pml was checked against it (recorded {fields[0][:12]}, "
            f"now {now[:12]}): review the model, then run `python -m tools model --rehash`"
        ]
    return []


def rehash(layout: Layout = DEFAULT) -> str:
    overlay = layout.root / OVERLAY
    if not overlay.is_file():
        raise ToolError(f"model: {OVERLAY} not found; nothing to record")
    line = f"{_sha256(overlay)}  {OVERLAY}\n"
    (layout.root / HASH_FILE).write_text(line)
    return line.strip()


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def select(stages: Sequence[str] | None) -> list[Check]:
    if not stages:
        return list(CHECKS)
    unknown = sorted(set(stages) - {c.stage for c in CHECKS})
    if unknown:
        raise ToolError(f"model: unknown stage {', '.join(unknown)}; modelled: final, 0, 3")
    return [c for c in CHECKS if c.stage in stages]


def _cmd_model(args: argparse.Namespace) -> int:
    if args.rehash:
        print(f"recorded {rehash()}")
        return 0
    problems = overlay_hash_problems()
    if args.check_hash:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    tools = find_tools()
    outcomes: list[Outcome] = []
    for check in select(args.stage):
        print(f"model: {check.name} ({check.bounds()}) ...", file=sys.stderr, flush=True)
        outcomes.append(run_check(check, DEFAULT, tools))
    print("\n".join(render_table(outcomes)))
    for o in outcomes:
        if not o.trail:
            continue
        print(f"\n{o.check.name}: {o.verdict}")
        if o.check.test == FINDING:
            print("  no regression test covers this interleaving")
        elif o.check.test:
            print(f"  reproduces {TESTS}{o.check.test}")
        for line in o.trail:
            print(f"  {line}")
    failed = [o for o in outcomes if not o.ok and o.check.gating]
    for o in failed:
        want = "nothing" if o.check.expect == NONE else f"a {o.check.expect} at {o.check.where!r}"
        print(f"model: {o.check.name}: expected {want}, got {o.verdict}", file=sys.stderr)
    for problem in problems:
        print(f"model: {problem}", file=sys.stderr)
    return 1 if failed or problems else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "model", help="SPIN model checks of the dispatch protocol (final stage, stages 0 and 3)"
    )
    p.add_argument(
        "--stage", action="append", choices=["final", "0", "3"], help="only this stage (repeatable)"
    )
    p.add_argument(
        "--check-hash", action="store_true", help=f"fail if {OVERLAY} changed since the model's review"
    )
    p.add_argument("--rehash", action="store_true", help=f"record {OVERLAY}'s hash after reviewing the model")
    p.set_defaults(func=_cmd_model)

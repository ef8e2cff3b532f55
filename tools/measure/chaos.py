"""``python -m tools chaos``: a seeded, bounded soak of every stage, checked against invariants.

A run is a schedule drawn from ``(seed, run)`` alone (``schedule``): start method, parallelism,
tasks with workload and result sizes from 1 KB to 256 KB, how they are dispatched, and the
faults: SIGKILL of a worker while idle, running or writing its result, SIGTERM to the
dispatching process mid-batch. Every stage plays the same schedules (``tools/measure/chaos_probe.py``
in the stage's venv, under the harness watchdog) and ``check`` judges each observation:

- no hang: the watchdog kills a deadlocked group in seconds; anything else has a deadline;
- every dispatched key reaches exactly one terminal state; a key whose worker was killed
  (or that was in flight when SIGTERM came) may instead be reported failed as lost;
- no result attributed to the wrong key: a failing task's exception carries a token
  naming its own key, and each key must end in the state its schedule says (a key that
  was never disturbed and is reported failed without its token was misattributed);
- ``end()`` returns within a bound;
- no orphaned task process: every task runs, as under task-sdk's ``supervise``, in a task
  process its worker forks and waits for. Bound: 0. When a key's terminal state is reported
  (``change_state`` is entered: a killed worker's key reported failed as lost, or any other
  report) every task process of that key is dead (gone from ``/proc``, or a zombie: Z or X),
  and once ``end()`` has returned no task process of the run is alive. The tolerance is 0,
  not a grace period: patch 0009 SIGKILLs what a dead worker left and waits, by pidfd, until
  it has exited before it fails the key, and the probe looks at ``/proc`` after that wait
  (a killed process shows Z or X, or is gone, from its exit on); a worker that was not
  killed has waited for its task process before it reports. A violation says how long the
  orphan ran on after the report when it ended by itself. Only the stages from the one of
  patch ``0009-kill-a-dead-localexecutor-workers-task-processes`` on (found by that name
  in ``patches/series``) claim this invariant: earlier stages leave a killed worker's task
  process running, so there the violations are counted and shown, marked, and fail nothing.

The schedule is exact on replay (``--replay SEED:RUN``); the instant a fault lands relative
to the executor's work is up to the OS, so a timing-dependent failure may need a few replays.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.engine.series import read_series_names
from tools.measure.bench import Stage, load_stages, parse_stages, run_probe, stage_python
from tools.measure.e2e import procfs
from tools.shared import pins, table
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.pins import Line

PROBE = Path(__file__).resolve().parent / "chaos_probe.py"
DEFAULT_SEED = 2026
DEFAULT_RUNS = 6
KILLS = ("kill_idle", "kill_running", "kill_writing")
KINDS = (*KILLS, "sigterm")
KIB = 1024
# The patch from whose stage on no task process outlives its worker (found in patches/series by this name).
ORPHANS_PATCH = "kill-a-dead-localexecutor-workers-task-processes"
ORPHANS_BOUND = "task process dead when its key's terminal state was reported, and after end() returned"


# --------------------------------------------------------------------------------------
# Schedules: pure functions of (seed, run)
# --------------------------------------------------------------------------------------


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def schedule(seed: int, run: int) -> dict[str, Any]:
    """Run ``run`` of ``seed``: everything the probe does, decided here and nowhere else."""
    rng = random.Random(f"lepatch-chaos:{seed}:{run}")
    spawn = rng.random() < 0.25
    parallelism = rng.randint(1, 2 if spawn else 4)
    n = rng.randint(3, 10 if spawn else 30)
    tasks: list[dict[str, Any]] = []
    for j in range(n):
        fails = rng.random() < 0.5
        tasks.append(
            {
                "task_id": f"r{run}_t{j}",
                "pad": _log_uniform(rng, KIB, 256 * KIB),
                "fail_bytes": _log_uniform(rng, KIB, 256 * KIB) if fails else 0,
                "sleep_ms": 0 if rng.random() < 0.5 else rng.randint(5, 300),
            }
        )
    mode = rng.choice(["one_batch", "slots", "chunks"])
    chunks = [rng.randint(1, 8) for _ in range(n)] if mode == "chunks" else []
    work_s = sum(t["sleep_ms"] for t in tasks) / 1000 / parallelism
    startup_s = 5.0 * parallelism if spawn else 0.0  # a spawned worker imports Airflow first
    # Faults land while there is work in flight (spawned workers take seconds to start).
    window_ms = 200 + int(1000 * work_s) + (2500 * parallelism if spawn else 0)
    faults: list[dict[str, Any]] = [
        {"kind": rng.choice(KILLS), "at_ms": rng.randint(0, window_ms), "pick": rng.randrange(1000)}
        for _ in range(rng.choice([1, 1, 2, 3]))
    ]
    if rng.random() < 0.25 or run % 4 == 3:
        # Mid-batch: early, while a big batch is still being written.
        faults.append({"kind": "sigterm", "at_ms": rng.randint(0, 300), "pick": 0})
    faults.sort(key=lambda f: (f["at_ms"], f["kind"]))
    # The last few tasks are held back until the faults are over: a workload dispatched
    # after a worker died must still run (the idle worker killed holding the read lock).
    late_from = n - rng.randint(1, max(1, n // 3))
    late_ms = max((f["at_ms"] for f in faults), default=0) + 100
    return {
        "seed": seed,
        "run": run,
        "start_method": "spawn" if spawn else "fork",
        "parallelism": parallelism,
        "dispatch": mode,
        "chunks": chunks,
        "poll_ms": rng.choice([1, 5, 20, 50]),
        "tasks": tasks,
        "late_from": late_from,
        "late_ms": late_ms,
        "faults": faults,
        # Time for every key to be reported before end() is called anyway.
        "budget_s": round(4.0 + startup_s + 2 * work_s + late_ms / 1000, 2),
        # end() may run what is still queued: the work left plus starting workers.
        "end_bound_s": round(5.0 + startup_s + 2 * work_s, 2),
    }


def expected_state(task: dict[str, Any]) -> str:
    return "failed" if task["fail_bytes"] else "success"


def parse_replay(text: str) -> tuple[int, int]:
    try:
        seed, run = text.split(":")
        return int(seed), int(run)
    except ValueError:
        raise ToolError(f"--replay {text!r}: expected SEED:RUN, e.g. --replay 2026:3") from None


# --------------------------------------------------------------------------------------
# Invariants: pure functions of (schedule, observation)
# --------------------------------------------------------------------------------------


@dataclass
class Verdict:
    seed: int
    run: int
    faults: list[dict[str, Any]] = field(default_factory=list)  # the ones that fired
    hang: str = ""
    lost: list[str] = field(default_factory=list)
    misattributed: list[str] = field(default_factory=list)
    end_slow: str = ""
    error: str = ""
    orphans: list[str] = field(default_factory=list)
    orphans_judged: bool = False  # the observation recorded task processes
    orphans_claimed: bool = True  # the stage claims no orphaned task process (patch 0009 on)

    @property
    def ok(self) -> bool:
        broken = self.hang or self.lost or self.misattributed or self.end_slow or self.error
        return not (broken or (self.orphans and self.orphans_claimed))

    @property
    def ref(self) -> str:
        return f"{self.seed}:{self.run}"

    def problems(self) -> list[str]:
        out = [self.hang] if self.hang else []
        out += [f"lost: {x}" for x in self.lost]
        out += [f"misattributed: {x}" for x in self.misattributed]
        out += [x for x in (self.end_slow, self.error) if x]
        if self.orphans_claimed:
            out += [f"orphan: {x}" for x in self.orphans]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.ref,
            "ok": self.ok,
            "faults": self.faults,
            "hang": self.hang,
            "lost": self.lost,
            "misattributed": self.misattributed,
            "end_slow": self.end_slow,
            "error": self.error,
            "orphans": self.orphans,
            "orphans_claimed": self.orphans_claimed,
        }


def orphans_claimed_from(series_names: Sequence[str]) -> int | None:
    """The first stage that claims no orphaned task process: that of patch ORPHANS_PATCH; None without it."""
    for i, name in enumerate(series_names):
        if ORPHANS_PATCH in name:
            return i + 1  # stage k = base + the first k patches
    return None


def orphaned_task_processes(obs: dict[str, Any]) -> list[str] | None:
    """The task processes alive when their key was reported, or after end(); None if none were recorded."""
    if "at_report" not in obs and "after_end" not in obs:
        return None
    ended = {(task, pid): t for task, pid, t in obs.get("task_exits", [])}
    out = []
    for task, pid, state, when, proc in obs.get("at_report", []):
        if proc in procfs.DEAD:
            continue
        end = ended.get((task, pid))
        if end is None:
            after = "; it was still running when the run was over"
        elif end >= when:
            after = f"; it ran on {1000 * (end - when):.0f} ms more"
        else:  # its exit mark is written just before it exits
            after = "; it was exiting by itself"
        out.append(f"{task}: task process {pid} alive ({proc}) when the key was reported {state}{after}")
    for task, pid, proc in obs.get("after_end", []):
        if proc not in procfs.DEAD:
            out.append(f"{task}: task process {pid} alive ({proc}) after end() returned")
    return out


def check(sched: dict[str, Any], obs: dict[str, Any], orphans_claimed: bool = True) -> Verdict:
    """Judge one observation of ``sched`` (see the module docstring for the invariants).

    ``orphans_claimed``: whether the stage claims that no task process outlives its worker
    (stages before patch 0009 do not: their orphans are counted, and fail nothing).
    """
    v = Verdict(sched["seed"], sched["run"], orphans_claimed=orphans_claimed)
    v.faults = [f for f in obs.get("faults", []) if "skipped" not in f]
    if obs.get("hang"):
        v.hang = obs["hang"] if obs["hang"].startswith(("hang", "error")) else f"hang: {obs['hang']}"
        return v
    tasks = {t["task_id"]: t for t in sched["tasks"]}
    # Still queued when the loop stopped, or given back by end(): the scheduler's to run, not reported.
    not_taken = set(obs.get("not_taken", [])) | set(obs.get("given_back", []))
    dispatched = [k for k in obs.get("dispatched", []) if k not in not_taken]
    killed_pids = {f["pid"] for f in v.faults if f["kind"] in KILLS and "pid" in f}
    terminated = bool(obs.get("terminated")) or any(f["kind"] == "sigterm" for f in v.faults)
    started: dict[str, set[int]] = {}
    for task, pid in obs.get("started", []):
        started.setdefault(task, set()).add(pid)
    done: dict[str, set[int]] = {}
    for task, pid in obs.get("done", []):
        done.setdefault(task, set()).add(pid)

    def disturbed(task: str) -> bool:
        """May this key be reported failed as lost? Its worker died, or it never got to run."""
        if started.get(task, set()) & killed_pids:
            return True
        never_ran = not started.get(task)
        return never_ran and (bool(killed_pids) or terminated)

    terminal: dict[str, list[list[Any]]] = {}
    for event in obs.get("events", []):
        task, state = event[0], event[1]
        if state in ("success", "failed"):
            terminal.setdefault(task, []).append(event)
    for task in sorted(terminal):
        if task not in tasks or task not in obs.get("dispatched", []):
            v.misattributed.append(f"{task}: reported {terminal[task][0][1]} but was never dispatched")
    for task in dispatched:
        reports = terminal.get(task, [])
        if not reports:
            why = (
                "its worker was killed" if started.get(task, set()) & killed_pids else "no fault explains it"
            )
            v.lost.append(f"{task}: dispatched, never reported ({why})")
            continue
        if len(reports) > 1:
            states = ", ".join(r[1] for r in reports)
            v.misattributed.append(f"{task}: reported {len(reports)} times ({states})")
        state, token = reports[0][1], reports[0][2] if len(reports[0]) > 2 else None
        if token is not None and token != task:
            v.misattributed.append(f"{task}: reported {state} with the exception of {token}")
        want = expected_state(tasks[task])
        if state == want or (state == "failed" and disturbed(task)):
            continue
        ran_to_end = bool(done.get(task)) and not (done.get(task, set()) <= killed_pids)
        v.misattributed.append(
            f"{task}: expected {want}, reported {state}"
            + (" (it ran to completion on a live worker)" if ran_to_end else "")
        )
    for token, key_task in obs.get("tokens", []):
        if key_task is not None and token != key_task:
            v.misattributed.append(f"{token}'s exception arrived in a result for {key_task}")
    if obs.get("error"):
        v.error = "error: the executor raised: " + obs["error"].strip().splitlines()[-1][:200]
    if obs.get("end_error"):
        v.error = v.error or "error: end() raised: " + obs["end_error"].strip().splitlines()[-1][:200]
    end_s = obs.get("end_s")
    if end_s is not None and end_s > sched["end_bound_s"]:
        v.end_slow = f"end() took {end_s:.1f}s, bound {sched['end_bound_s']:g}s"
    orphans = orphaned_task_processes(obs)
    v.orphans_judged = orphans is not None
    v.orphans = orphans or []
    return v


# --------------------------------------------------------------------------------------
# Per stage summary and the table
# --------------------------------------------------------------------------------------


@dataclass
class StageSummary:
    stage: Stage
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def faults(self) -> Counter[str]:
        return Counter(f["kind"] for v in self.verdicts for f in v.faults)

    @property
    def hangs(self) -> int:
        return sum(1 for v in self.verdicts if v.hang)

    @property
    def lost(self) -> int:
        return sum(len(v.lost) for v in self.verdicts)

    @property
    def misattributed(self) -> int:
        return sum(len(v.misattributed) for v in self.verdicts)

    @property
    def end_slow(self) -> int:
        return sum(1 for v in self.verdicts if v.end_slow)

    @property
    def errors(self) -> int:
        return sum(1 for v in self.verdicts if v.error)

    @property
    def orphans(self) -> int:
        return sum(len(v.orphans) for v in self.verdicts)

    @property
    def orphans_judged(self) -> bool:
        return any(v.orphans_judged for v in self.verdicts)

    @property
    def orphans_claimed(self) -> bool:
        return all(v.orphans_claimed for v in self.verdicts)

    @property
    def orphans_runs(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.orphans]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def failing(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage.k,
            "patch": self.stage.title,
            "runs": len(self.verdicts),
            "faults": dict(self.faults),
            "hangs": self.hangs,
            "lost_keys": self.lost,
            "misattributed_keys": self.misattributed,
            "end_over_bound": self.end_slow,
            "errors": self.errors,
            "orphan_task_processes": self.orphans,
            "orphans_judged_runs": sum(1 for v in self.verdicts if v.orphans_judged),
            "orphans_claimed": self.orphans_claimed,
            "seconds": round(self.seconds, 1),
            "verdicts": [v.to_json() for v in self.verdicts],
        }


def render(summaries: Sequence[StageSummary]) -> str:
    """The table; its ``orphans`` column only when some observation recorded task processes.

    (An observation without them, from a probe before task processes, judges nothing: a 0 there would
    claim what was never looked at.) A count marked ``*`` is of a stage that does not claim the invariant.
    """
    orphans = any(s.orphans_judged for s in summaries)
    header = [
        "stage",
        "runs",
        "faults (idle/run/write/term)",
        "hangs",
        "lost",
        "misattr",
        "end>bound",
        "errors",
        *(["orphans"] if orphans else []),
    ]
    body = []
    for s in summaries:
        f = s.faults
        fault_cell = f"{sum(f.values())} ({'/'.join(str(f[k]) for k in KINDS)})"
        body.append(
            [
                s.stage.short,
                str(len(s.verdicts)),
                fault_cell,
                str(s.hangs),
                str(s.lost),
                str(s.misattributed),
                str(s.end_slow),
                str(s.errors),
                *([f"{s.orphans}{'' if s.orphans_claimed else '*'}"] if orphans else []),
            ]
        )
    return "\n".join(table.render([header, *body], right=range(len(header)), strip=False))


def render_orphans_note(summaries: Sequence[StageSummary], claimed_from: int | None) -> str:
    """What the orphans column counts, its bound, and which stages claim it."""
    since = (
        f"claimed from stage {claimed_from} (patch *{ORPHANS_PATCH}*) on"
        if claimed_from is not None
        else f"claimed by no stage (no patch *{ORPHANS_PATCH}* in patches/series)"
    )
    note = f"orphans: task processes not dead when due (bound 0, tolerance 0: {ORPHANS_BOUND}); {since}"
    if any(not s.orphans_claimed for s in summaries):
        note += "; * = a stage before it: counted, not failing"
    return note


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def play(
    line: Line,
    stage: Stage,
    schedules: list[dict[str, Any]],
    layout: Layout = DEFAULT,
    stuck_after: float = 1.5,
    orphans_claimed: bool = True,
) -> tuple[list[Verdict], list[dict[str, Any]]]:
    """Play ``schedules`` on one stage; return the verdicts and the raw observations."""
    python = stage_python(line, stage, layout)
    chunks = []
    for method in ("fork", "spawn"):
        group = [s for s in schedules if s["start_method"] == method]
        if group:
            chunks.append({"start_method": method, "schedules": group})
    budget = 120 + sum(s["budget_s"] + s["end_bound_s"] + 40 for s in schedules)
    payload = run_probe(python, PROBE, {"chunks": chunks, "stuck_after": stuck_after}, budget, layout)
    if "error" in payload:
        observations = [{"run": s["run"], "hang": "error: " + payload["error"]} for s in schedules]
    else:
        observations = payload["runs"]
    by_run = {o["run"]: o for o in observations}
    verdicts = []
    for sched in schedules:
        obs = by_run.get(
            sched["run"], {"run": sched["run"], "hang": "error: the probe returned nothing for it"}
        )
        verdicts.append(check(sched, obs, orphans_claimed))
    return verdicts, [by_run.get(s["run"], {}) for s in schedules]


def _replay_command(line: Line, stage: Stage, ref: str) -> str:
    return f"python -m tools chaos --line {line.name} --stages {stage.k} --replay {ref}"


def run_chaos(args: argparse.Namespace, layout: Layout = DEFAULT) -> int:
    line: Line = args.line
    wanted = parse_stages(args.stages)
    stages = load_stages(line, wanted)
    claimed_from = orphans_claimed_from(read_series_names(layout.series_file))
    if wanted is not None and 0 not in wanted:
        stages = [s for s in stages if s.k != 0]  # base is only forced in for bench's ratios
    if args.replay:
        seed, run = parse_replay(args.replay)
        schedules = [schedule(seed, run)]
        print(json.dumps(schedules[0], indent=1))
    else:
        seed = DEFAULT_SEED if args.seed is None else args.seed
        schedules = [schedule(seed, r) for r in range(args.runs)]
    started = time.monotonic()
    for stage in stages:
        stage_python(line, stage, layout)  # one at a time; the soak then runs stages side by side

    def soak(stage: Stage) -> tuple[StageSummary, list[dict[str, Any]]]:
        t0 = time.monotonic()
        claimed = claimed_from is not None and stage.k >= claimed_from
        verdicts, observations = play(line, stage, schedules, layout, orphans_claimed=claimed)
        summary = StageSummary(stage, verdicts, time.monotonic() - t0)
        print(
            f"stage {stage.short:>4}: {len(verdicts)} runs, {len(summary.failing)} failing, "
            f"{summary.orphans} orphaned task processes{'' if claimed else ' (not claimed)'}, "
            f"{summary.seconds:.0f}s",
            file=sys.stderr,
        )
        return summary, observations

    # Stages soak side by side (--jobs): a broken stage spends most of its time waiting for
    # the watchdog to be sure it is stuck, not on the CPU.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = list(pool.map(soak, stages))
    summaries = [summary for summary, _ in done]
    raw: dict[str, Any] = {str(summary.stage.k): obs for summary, obs in done}
    if args.replay:
        for summary in summaries:
            for v in summary.verdicts:
                print(f"  stage {summary.stage.short}: faults fired: {json.dumps(v.faults)}")
                for problem in v.problems() or ["ok"]:
                    print(f"  stage {summary.stage.short}: {problem}")
                if not v.orphans_claimed:
                    for orphan in v.orphans:
                        print(f"  stage {summary.stage.short}: orphan (not claimed before 0009): {orphan}")
    seconds = time.monotonic() - started
    print(
        f"\nchaos {line.name} ({line.version}): "
        + (f"replay {args.replay}" if args.replay else f"seed {seed}, {len(schedules)} runs per stage")
        + f", {seconds:.0f}s\n"
    )
    print(render(summaries))
    if any(s.orphans_judged for s in summaries):
        print(render_orphans_note(summaries, claimed_from))
    print("\nstages: " + "; ".join(f"{s.stage.short} = {s.stage.title}" for s in summaries))
    for s in summaries:
        for v in s.failing[: args.show]:
            problems = v.problems()
            print(f"\n[{s.stage.short}] run {v.ref}: {problems[0]}")
            for p in problems[1:4]:
                print(f"    {p}")
            if len(problems) > 4:
                print(f"    ... {len(problems) - 4} more")
            print(f"    replay: {_replay_command(line, s.stage, v.ref)}")
        if len(s.failing) > args.show:
            print(f"\n[{s.stage.short}] {len(s.failing) - args.show} more failing runs in the JSON")
        if not s.orphans_claimed and s.orphans_runs:
            # Not failures on this stage, but what the invariant would catch: show a few.
            for v in s.orphans_runs[: args.show]:
                print(f"\n[{s.stage.short}] run {v.ref}: orphan (not claimed before 0009): {v.orphans[0]}")
                if len(v.orphans) > 1:
                    print(f"    ... {len(v.orphans) - 1} more in this run")
    name = f"{line.name}-replay-{args.replay.replace(':', '-')}" if args.replay else line.name
    out = args.json or layout.build / "chaos" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "line": line.name,
        "version": line.version,
        "seed": seed,
        "runs": len(schedules),
        "replay": args.replay,
        "seconds": round(seconds, 1),
        "stages": [s.to_json() for s in summaries],
        "schedules": schedules,
        "observations": raw,
    }
    out.write_text(json.dumps(document, indent=1, default=str) + "\n")
    print(f"\nJSON: {layout.rel(out)}")
    last = summaries[-1]
    if not last.ok:
        print(
            f"FAILED: stage {last.stage.short} ({last.stage.title}) broke an invariant; see above",
            file=sys.stderr,
        )
        return 1
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chaos", help="seeded soak with SIGKILL/SIGTERM faults per stage, checked by invariants"
    )
    p.add_argument(
        "--line", type=pins.line_arg, default=pins.PRIMARY.name, help="release line (default %(default)s)"
    )
    p.add_argument("--stages", help="stages to soak, e.g. 0,3,5-8 (default: all)")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"runs per stage (default {DEFAULT_RUNS})")
    p.add_argument("--seed", type=int, help=f"seed of the schedules (default {DEFAULT_SEED})")
    p.add_argument("--replay", metavar="SEED:RUN", help="play exactly one run of a seed, with its details")
    p.add_argument("--jobs", type=int, default=3, help="stages soaked side by side (default 3)")
    p.add_argument("--show", type=int, default=3, help="failing runs to describe per stage (default 3)")
    p.add_argument(
        "--json",
        type=Path,
        help="where to write the JSON (default build/chaos/<line>.json, or <line>-replay-SEED-RUN.json)",
    )
    p.set_defaults(func=run_chaos)

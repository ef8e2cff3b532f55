"""``python -m tools e2e`` (``nox -s e2e``): options in, one session of scenarios, exit status out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.delivery import package
from tools.engine import releases
from tools.measure.e2e import driver, uipoll
from tools.measure.e2e.driver import (
    DEFAULT_SCENARIOS,
    DEFAULT_TP_TASKS,
    ORPHAN_DEADLINE,
    SCENARIOS,
    Options,
    run_session,
)
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT

EXECUTORS = ("overlay", "package", "celery")
INSTALLS = ("files", "wheels")
# What --executor celery can run: the LocalExecutor's kill scenarios have no Celery counterpart.
CELERY_SCENARIOS = ("throughput",)

# The driver's first docstring line says what the session does, for --help.
DESCRIPTION = (driver.__doc__ or "").splitlines()[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        dest="scenarios",
        help=(
            f"run only this scenario (repeatable; default: {', '.join(DEFAULT_SCENARIOS)}, in order; "
            "kill-orphan and throughput only when asked for)"
        ),
    )
    p.add_argument(
        "--db",
        choices=("sqlite", "postgres"),
        default=None,
        help="the metadata database (default: sqlite; postgres with --executor celery, which needs it)",
    )
    p.add_argument(
        "--line", default=pins.PRIMARY.name, help="release line or pinned version (default %(default)s)"
    )
    p.add_argument(
        "--core",
        metavar="VERSION",
        help=(
            "another apache-airflow-core release the line covers (e.g. 3.3.0): the e2e venv gets it with "
            "the task-sdk release it requires, and the executor that release gets (default: the line's "
            "pinned version)"
        ),
    )
    p.add_argument(
        "--stage",
        type=int,
        default=None,
        help="executor stage: 0 = unpatched base, k = first k patches (default: the full series overlay)",
    )
    p.add_argument(
        "--compare-stages",
        metavar="LIST",
        help=(
            "run the scenarios once per stage, e.g. 0,9 or 0,full (full = the series overlay), and "
            "end with the throughput figures of each as ratios to the first; replaces --stage"
        ),
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --compare-stages: run the stages this many times, interleaved (0,9,0,9,...)",
    )
    p.add_argument("--parallelism", type=int, default=8)
    p.add_argument(
        "--tasks",
        type=int,
        default=DEFAULT_TP_TASKS,
        help=(
            "throughput: how many no-op tasks its DAG has; scale: how many BashOperator jobs "
            "(default %(default)s)"
        ),
    )
    p.add_argument(
        "--kills",
        type=int,
        default=driver.SCALE_DEFAULT_KILLS,
        help=(
            "scale: how many busy LocalExecutor workers are SIGKILLed, spread over the run "
            "(default %(default)s)"
        ),
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=120.0,
        help=(
            f"seconds from trigger to a final run state (kill-orphan: at least {ORPHAN_DEADLINE:g}; "
            "throughput: at least 60 + 1 per task)"
        ),
    )
    p.add_argument(
        "--stop-bound", type=float, default=30.0, help="seconds SIGTERM may take to stop the scheduler"
    )
    p.add_argument("--task-seconds", type=float, default=2.0, help="how long each DAG task sleeps")
    p.add_argument(
        "--min-heartbeat-interval",
        type=int,
        default=None,
        help=(
            "[workers] min_heartbeat_interval for the stack (Airflow's default: 5 s). It is also how long "
            "task-sdk's supervisor can sleep after its task process exited (the stalls column of the "
            "throughput table), the same for every stage: a lower value measures the executor with less "
            "of that noise"
        ),
    )
    p.add_argument(
        "--trace-loops",
        action="store_true",
        help=(
            "record the scheduler's loops from inside it (a hook put into the e2e venv for the session): "
            "how many, how many queued something, their CPU and the time the executor's heartbeat took "
            "(always on in the throughput scenario, whose CPU table needs the heartbeat's CPU)"
        ),
    )
    p.add_argument(
        "--airflow-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=(
            "an environment variable for every stage's stack, last (repeatable), e.g. "
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=0.2"
        ),
    )
    p.add_argument(
        "--supervisor",
        metavar="STAGE",
        help=(
            "task-sdk's supervisor.py from this stage (a number, or 'full') whatever the executor's stage; "
            "e.g. --stage 0 --supervisor full: the unpatched executor with the series' supervisor fix"
        ),
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="overlay",
        help=(
            "overlay (default): the series' files in place of Airflow's; package: the line's wheel "
            "(nox -s package) pip-installed into the e2e venv and chosen by AIRFLOW__CORE__EXECUTOR, "
            "Airflow's own files left the pinned bases; celery: CeleryExecutor with a Redis broker "
            "(redis-server, started by the session) and `airflow celery worker` at --parallelism "
            "concurrency, PostgreSQL as database and result backend, the throughput scenario only; "
            "a stage then picks task-sdk's supervisor alone (0: unpatched, full: the fix, installed "
            "with overlay install --only supervisor)"
        ),
    )
    p.add_argument(
        "--install",
        choices=INSTALLS,
        default="files",
        help=(
            "how the full series gets in (overlay or celery executor): files (default), the overlay's "
            "files in place of Airflow's; wheels, Airflow's own core and task-sdk wheels rebuilt with "
            "them (nox -s wheels, X+lepatch.N) installed over the release. Stage 0 stays the release"
        ),
    )
    p.add_argument(
        "--celery-reap-sigchld",
        action="store_true",
        help=(
            "with --executor celery: each Celery pool child reaps its children from a SIGCHLD handler "
            "(waitpid(-1)), as in apache/airflow#70117, so psutil's wait() returns None"
        ),
    )
    p.add_argument(
        "--db-pool",
        metavar="headroom|airflow|N",
        default=None,
        help=(
            "each component's database pool, in every scenario: headroom, --parallelism + "
            f"{driver.POOL_HEADROOM} connections; airflow, Airflow's own settings "
            f"({driver.AIRFLOW_POOL_SIZE} + {driver.AIRFLOW_MAX_OVERFLOW} overflow, nothing set); "
            f"N, a pool of N. Overflow {driver.AIRFLOW_MAX_OVERFLOW} and SQLAlchemy's "
            f"{driver.SQLALCHEMY_POOL_TIMEOUT:g} s pool_timeout in every case. Default: airflow in "
            f"{', '.join(sorted(driver.AIRFLOW_POOL_SCENARIOS))}, headroom in the others"
        ),
    )
    p.add_argument(
        "--split-api",
        action="store_true",
        help=(
            "run the execution API (task starts, heartbeats, states) in an api-server process of its "
            "own (`--apps execution`), the UI's and REST's in another (`--apps core`), each with its "
            "own event loop and database pool"
        ),
    )
    p.add_argument(
        "--no-ui-poll",
        dest="ui_poll",
        action="store_false",
        help=(
            "throughput: no client polling the run as a UI's run page does (by default one polls it "
            f"every {uipoll.UI_REFRESH_INTERVAL:g} s, Airflow's [api] auto_refresh_interval, with the "
            "UI's token)"
        ),
    )
    p.add_argument("--out", type=Path, default=LAYOUT.build / "e2e")


def line_of(name: str) -> pins.Line:
    """``--line``: a release line or pinned version; one line naming the lines otherwise."""
    try:
        return pins.get_line(name)
    except KeyError as e:
        raise ToolError(str(e.args[0])) from None


def options_from(args: argparse.Namespace) -> Options:
    line = line_of(args.line)
    if args.stage is not None and args.stage < 0:
        raise ToolError(f"--stage must be >= 0, got {args.stage}")
    if args.parallelism < 2:
        raise ToolError("--parallelism must be at least 2 (the scenarios kill a worker)")
    if args.kills < 0:
        raise ToolError(f"--kills must be at least 0, got {args.kills}")
    if args.tasks < 1:
        raise ToolError(f"--tasks must be at least 1, got {args.tasks}")
    if args.min_heartbeat_interval is not None and args.min_heartbeat_interval < 1:
        raise ToolError(f"--min-heartbeat-interval must be at least 1, got {args.min_heartbeat_interval}")
    compare = parse_stages(args.compare_stages) if args.compare_stages else []
    if compare and args.stage is not None:
        raise ToolError("--stage and --compare-stages exclude each other")
    if args.executor == "package" and (compare or args.stage is not None or args.supervisor is not None):
        raise ToolError(
            "--executor package runs the full series' wheel: no --stage, --compare-stages or --supervisor"
        )
    if args.install == "wheels" and (
        args.executor == "package"
        or args.supervisor is not None
        or any(s not in (None, 0) for s in compare)
        or args.stage not in (None, 0)
    ):
        raise ToolError(
            "--install wheels: the full series (and stage 0 beside it) with --executor overlay or celery; "
            "no --supervisor, no other stage"
        )
    if args.rounds < 1 or (args.rounds > 1 and not compare):
        raise ToolError("--rounds must be at least 1, and more than 1 only with --compare-stages")
    core = core_release(line, args, compare)
    db = args.db or ("postgres" if args.executor == "celery" else "sqlite")
    scenarios = list(dict.fromkeys(args.scenarios or DEFAULT_SCENARIOS))
    if args.executor == "celery":
        check_celery(args, compare, db)
        scenarios = list(dict.fromkeys(args.scenarios or CELERY_SCENARIOS))
    elif args.celery_reap_sigchld:
        raise ToolError("--celery-reap-sigchld needs --executor celery")
    return Options(
        line=line,
        core=core,
        stage=args.stage,
        db=db,
        parallelism=args.parallelism,
        scenarios=scenarios,
        deadline=args.deadline,
        stop_bound=args.stop_bound,
        task_seconds=args.task_seconds,
        out=args.out.resolve(),
        tasks=args.tasks,
        kills=args.kills,
        compare=compare,
        rounds=args.rounds,
        min_heartbeat_interval=args.min_heartbeat_interval,
        trace_loops=args.trace_loops,
        airflow_env=parse_env(args.airflow_env),
        supervisor=parse_supervisor(args.supervisor),
        executor=args.executor,
        install=args.install,
        reap_sigchld=args.celery_reap_sigchld,
        db_pool=None if args.db_pool is None else parse_db_pool(args.db_pool),
        ui_poll=args.ui_poll,
        split_api=args.split_api,
    )


def _either(items: list[str]) -> str:
    return " or ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def check_core(line: pins.Line, core: str) -> None:
    """``--core``: one line naming the line and the releases it covers, unless ``core`` is one."""
    if core not in releases.verified_versions(line):
        other = next((ln for ln in pins.LINES if core in releases.verified_versions(ln)), None)
        hint = f"; {core} is line {other.name}'s: add --line {other.name}" if other else ""
        raise ToolError(
            f"--core {core}: not a release line {line.name} covers "
            f"(apache-airflow-core {', '.join(releases.verified_versions(line))}){hint}"
        )


def core_release(line: pins.Line, args: argparse.Namespace, compare: list[int | None]) -> str:
    """``--core``: a release ``line`` covers (default its pinned version), with what can run on it."""
    core = args.core or line.version
    check_core(line, core)
    if core == line.version:
        return core
    sdk = line.core_sdk[core]
    odd = [s for s in [args.stage, *compare] if s not in (None, 0)]
    if odd or args.supervisor is not None:
        raise ToolError(
            f"--core {core}: stage 0 (the release as shipped) or the full series only; the series' "
            f"intermediate stages are applied to the line's base {line.version}"
        )
    if args.executor == "package":
        wheel = package.verified(line)
        if sdk not in wheel.task_sdk:
            ok = [c for c in releases.verified_versions(line) if line.core_sdk.get(c) in wheel.task_sdk]
            raise ToolError(
                f"--executor package --core {core}: the {line.name} wheel requires apache-airflow-task-sdk "
                f"{'/'.join(wheel.task_sdk)} and apache-airflow-core {core} requires {sdk}, a pair pip "
                f"refuses; run the overlay there (--executor overlay --core {core}) or the wheel on "
                f"--core {_either(ok)}"
            )
    return core


def check_celery(args: argparse.Namespace, compare: list[int | None], db: str) -> None:
    """``--executor celery``: what it runs with, one line for anything else."""
    if db != "postgres":
        raise ToolError(
            "--executor celery needs --db postgres (the metadata database and Celery result backend)"
        )
    other = [s for s in args.scenarios or () if s not in CELERY_SCENARIOS]
    if other:
        raise ToolError(
            f"--executor celery runs {', '.join(CELERY_SCENARIOS)} only (the others kill LocalExecutor "
            f"workers), not {', '.join(other)}"
        )
    if args.supervisor is not None:
        raise ToolError(
            "--executor celery: the stage itself picks the supervisor (0 or full); no --supervisor"
        )
    for stage in [args.stage, *compare]:
        if stage not in (None, 0):
            raise ToolError(
                f"--executor celery: stage {stage} means nothing there; task-sdk's supervisor is unpatched "
                "(0) or fixed (full, the default)"
            )


def parse_supervisor(text: str | None) -> int | str | None:
    """``--supervisor``: a stage number, None for the series ('full'), or "" when not given."""
    return "" if text is None else parse_stage(text, "--supervisor")


def parse_stage(text: str, flag: str) -> int | None:
    """A stage number, or ``full`` (``series``) for the series overlay (None); one line otherwise."""
    if text in ("full", "series"):
        return None
    try:
        stage = int(text)
    except ValueError:
        raise ToolError(f"{flag}: {text!r} is neither a stage number nor 'full'") from None
    if stage < 0:
        raise ToolError(f"{flag}: stage must be >= 0, got {stage}")
    return stage


def parse_db_pool(text: str) -> str:
    """``--db-pool``: headroom, airflow or a pool size of at least 1 (as digits); one line otherwise."""
    value = text.strip().lower()
    if value in (driver.DB_POOL_HEADROOM, driver.DB_POOL_AIRFLOW):
        return value
    if value.isdigit() and int(value) >= 1:
        return str(int(value))
    raise ToolError(
        f"--db-pool wants {driver.DB_POOL_HEADROOM} (parallelism + {driver.POOL_HEADROOM}), "
        f"{driver.DB_POOL_AIRFLOW} (Airflow's {driver.AIRFLOW_POOL_SIZE} + {driver.AIRFLOW_MAX_OVERFLOW}) "
        f"or a pool size of at least 1, not {text!r}"
    )


def parse_env(items: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs, later ones winning; one-line error for anything else."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ToolError(
                f"--airflow-env wants NAME=VALUE with NAME an environment variable name, not {item!r}"
            )
        env[name] = value
    return env


def parse_stages(text: str) -> list[int | None]:
    """``"0,9"`` -> [0, 9]; ``full`` (or ``series``) is the series overlay (None). At least two."""
    out: list[int | None] = []
    for part in (p.strip() for p in text.split(",")):
        stage = parse_stage(part, "--compare-stages")
        if stage in out:
            raise ToolError(f"--compare-stages: {part} given twice")
        out.append(stage)
    if len(out) < 2:
        raise ToolError(f"--compare-stages needs at least two stages, got {text!r}")
    return out


def _cmd_e2e(args: argparse.Namespace) -> int:
    return run_session(options_from(args))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "e2e",
        help="run the executor in a real Airflow and kill workers on purpose",
        description=DESCRIPTION,
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_e2e)
    lk = sub.add_parser(
        "e2e-lock",
        help="resolve each line's e2e environment as of its release into constraints/e2e-<line>.txt",
    )
    lk.add_argument("--line", action="append", help="only this line (repeatable; default: every line)")
    lk.add_argument(
        "--celery",
        action="store_true",
        help="the CeleryExecutor's (apache-airflow[celery]) into constraints/e2e-celery-<line>.txt",
    )
    lk.add_argument(
        "--core",
        metavar="VERSION",
        help=(
            "with one --line: another apache-airflow-core release it covers, as of that release's day, "
            "into constraints/e2e-<VERSION>.txt (what e2e --core VERSION installs with)"
        ),
    )
    lk.set_defaults(func=_cmd_e2e_lock)


def _cmd_e2e_lock(args: argparse.Namespace) -> int:
    from tools.measure.e2e import lock  # needs the index; the e2e session itself does not

    lines = [line_of(name) for name in args.line] if args.line else list(pins.LINES)
    if args.core is not None:
        if len(lines) != 1:
            raise ToolError("e2e-lock --core needs exactly one --line")
        check_core(lines[0], args.core)
    for line in lines:
        print(f"wrote {LAYOUT.rel(lock.lock_line(line, celery=args.celery, core=args.core))}")
    return 0


def parse_options(argv: list[str] | None = None) -> Options:
    """The session's options from a command line, as ``python -m tools.measure.e2e`` reads it."""
    parser = argparse.ArgumentParser(prog="python -m tools.measure.e2e", description=DESCRIPTION)
    add_arguments(parser)
    return options_from(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    try:
        return run_session(parse_options(argv))
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

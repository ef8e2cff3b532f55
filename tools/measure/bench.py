"""``python -m tools bench``: what each stage of the series costs, as ratios to unpatched base.

Every stage of a line (base, base + patch 1, ...) gets its own venv under
``build/stage-venvs/<line>/<k>`` with that stage's ``local_executor.py`` installed; the
measurements run there through ``tools/measure/bench_probe.py`` (which drives a real executor via
the test harness, under its deadlock watchdog). The machine is shared and noisy, so:

- every figure is divided by the same figure of unpatched base measured in the same run;
- the stages are interleaved round-robin (round 1: base, 1, 2, ..., peers; round 2: ...)
  so a burst of load elsewhere hits every stage alike instead of one stage's whole series;
- peers and floors (``ProcessPoolExecutor``, pickling into a drained pipe) run in the
  same rounds, in the base venv.

The ``loop`` figure (``tools/measure/bench_loop.py``) drives each stage's executor the way Airflow's
scheduler loop does (``slots_available``, ``queue_workload``, ``heartbeat()``, the event buffer,
the idle sleep) with tasks of realistic length: tasks/s, queued-to-start p50/p95, and
ready-to-start p50/p95 (every task is ready when the loop starts, so this is the whole wait, the
time a stage keeps a task waiting to be queued included).
``--loop-only`` runs just that figure; ``--extra NAME=PATH`` measures any ``local_executor.py``
(a prototype) as one more column, in the same rounds.

A stage that cannot do a measurement (base deadlocks on a batch bigger than the pipes
hold; base never reports the key of a killed worker) shows ``hang``/``never``/``n/a``; the
reason is in the JSON. ``build/bench/<line>.json`` has every sample.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.engine import fetch, venvs
from tools.shared import pins, table
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.pins import Line

PROBE = Path(__file__).resolve().parent / "bench_probe.py"
BASE = "0"
PEERS = "peers"  # the pseudo-stage that runs the peer and floor measurements (base venv)


# --------------------------------------------------------------------------------------
# Stage venvs (shared with tools.measure.chaos)
# --------------------------------------------------------------------------------------


@dataclass
class Stage:
    k: int
    title: str  # "base" or the patch file name (or the file of an extra)
    source: bytes
    label: str | None = None  # an extra column (``--extra NAME=PATH``), not a stage of the series

    @property
    def column(self) -> str:
        return self.label or str(self.k)

    @property
    def short(self) -> str:
        return self.label or ("base" if self.k == 0 else str(self.k))


EXTRA_K = -1  # the ``k`` of an extra column: it is no stage of the series


def parse_extra(text: str) -> Stage:
    """``NAME=PATH`` -> a column that measures the ``local_executor.py`` at PATH, named NAME."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ToolError(f"--extra {text!r}: expected NAME=PATH, e.g. proto=/tmp/local_executor.py")
    if not (name[0].isalpha() and all(c.isalnum() or c in "-_." for c in name)):
        raise ToolError(f"--extra {text!r}: NAME must start with a letter (letters, digits, - _ .)")
    if name in ("base", "ppe", "floor", PEERS):
        raise ToolError(f"--extra {text!r}: NAME {name!r} is taken by a column of the table")
    file = Path(path)
    if not file.is_file():
        raise ToolError(f"--extra {text!r}: {path} is not a file")
    return Stage(EXTRA_K, str(file.resolve()), file.read_bytes(), label=name)


def load_stages(line: Line, wanted: Iterable[int] | None = None) -> list[Stage]:
    """Stage 0..final of ``line`` (only ``wanted`` ones, plus base for the ratios)."""
    from tools.engine import apply

    result = apply.apply_line(line)
    names = ["base", *(p.name for p in result.patches)]
    available = range(result.final + 1)
    chosen = sorted({0, *(available if wanted is None else wanted)})
    missing = [k for k in chosen if k not in available]
    if missing:
        raise ToolError(
            f"{line.name} has stages 0..{result.final}, not {', '.join(map(str, missing))}"
            + (
                ""
                if result.ok
                else " (a patch failed to apply: python -m tools apply --line " + line.name + ")"
            )
        )
    return [Stage(k, names[k], result.code(k)) for k in chosen]


def parse_stages(text: str | None) -> list[int] | None:
    """``"0,3,5-8"`` -> [0, 3, 5, 6, 7, 8]; ``None``/``"all"`` -> None (every stage)."""
    if text is None or text == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.extend(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise ToolError(f"--stages {text!r}: expected numbers and ranges like 0,3,5-8") from None
    return sorted(set(out))


def stage_python(line: Line, stage: Stage, layout: Layout = DEFAULT, python: str | None = None) -> Path:
    """The python of ``build/stage-venvs/<line>/<k>``, made once, with ``stage.source`` installed.

    One venv per stage (not one venv whose executor is swapped) so that stages can be
    interleaved and other sessions' venvs are never touched.
    """
    constraints = venvs.lock_file(layout.constraints / f"{line.name}.txt", f"--line {line.name}", layout)
    venv = layout.build / "stage-venvs" / line.name / stage.column
    wheels, stamp = [fetch.ensure_wheel(line, layout)], {"wheel_sha256": line.wheel_sha256}
    # why no copy of uv's hardlinked files: install_executor replaces the file, never writes through it
    py = venvs.make(venv, python or sys.executable, [], constraints, stamp, wheels=wheels)
    target = venvs.install_executor(py, stage.source)
    if target.read_bytes() != stage.source:
        raise ToolError(f"{target}: installing stage {stage.short} of {line.name} did not take")
    return py


def probe_env(layout: Layout) -> dict[str, str]:
    """Environment of a probe: a private AIRFLOW_HOME, no database."""
    home = layout.build / "airflow-home"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__API_AUTH__JWT_SECRET": venvs.JWT_SECRET,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    env.pop("PYTHONPATH", None)
    return env


def run_probe(
    python: Path, probe: Path, request: dict[str, Any], timeout: float, layout: Layout
) -> dict[str, Any]:
    """Run a probe script in its own process group; kill the group if it overruns ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="lepatch-probe-") as tmp:
        req = Path(tmp, "request.json")
        req.write_text(json.dumps(request))
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                [str(python), str(probe), str(req)],
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
                env=probe_env(layout),
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                # SIGTERM first: the probe then kills its scenario's process group (its own).
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                return {"error": f"probe overran its {timeout:.0f}s bound and was stopped"}
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind
        if proc.returncode != 0:
            tail = err.read_text(errors="replace").strip().splitlines()[-3:]
            return {"error": f"probe exited {proc.returncode}: " + " | ".join(tail)}
        try:
            payload: dict[str, Any] = json.loads(out.read_text())
        except ValueError:
            return {"error": "probe printed no JSON: " + out.read_text(errors="replace")[-200:]}
        return payload


# --------------------------------------------------------------------------------------
# What is measured: rows of the table, and the probe specs that feed them.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    unit: str
    better: str = "lower"  # or "higher"


@dataclass
class Config:
    runs: int = 20  # samples of the dispatch figures per stage
    rounds: int = 2  # round-robin passes over the stages
    parallelism: int = 4
    small: int = 200
    large: int = 2000
    huge: int = 20000
    throughput_n: int = 2000
    scale_parallelism: tuple[int, ...] = (2, 8, 32)
    scale_runs: int = 1
    recovery_wait: float = 3.0
    stuck_after: float = 1.5
    # The scheduler-loop figure: (tasks, parallelism) configurations, runs of each (spread over
    # the rounds), the model's knobs (see tools/measure/bench_loop.py).
    loop: tuple[tuple[int, int], ...] = ((200, 16), (30, 8))
    loop_runs: int = 2
    loop_seed: int = 2026
    idle_sleep: float = 1.0  # [scheduler] scheduler_idle_sleep_time
    loop_cost: float = 0.02  # seconds of _do_scheduling's database work per loop iteration (modelled)
    max_tis_per_query: int = 16  # [scheduler] max_tis_per_query
    loop_duration: tuple[float, float] = (0.2, 3.0)
    loop_lag: tuple[float, float] = (0.05, 0.3)
    loop_only: bool = False

    @classmethod
    def quick(cls) -> Config:
        return cls(
            runs=3,
            rounds=1,
            large=1000,
            huge=0,
            throughput_n=300,
            scale_parallelism=(),
            scale_runs=1,
            recovery_wait=2.0,
            loop=((48, 8),),
            loop_runs=1,
        )

    def per_round(self, total: int, r: int) -> int:
        """How many of ``total`` samples round ``r`` takes (earlier rounds take the remainder)."""
        base, extra = divmod(total, self.rounds)
        return base + (1 if r < extra else 0)


def loop_id(n: int, parallelism: int) -> str:
    return f"loop_{n}_p{parallelism}"


def loop_rows(cfg: Config) -> list[Row]:
    out: list[Row] = []
    for n, q in cfg.loop:
        m = loop_id(n, q)
        out += [
            Row(f"{m}_tps", f"scheduler loop {n} tasks p{q}", "tasks/s", "higher"),
            Row(f"{m}_p50", "  queued -> started p50", "ms"),
            Row(f"{m}_p95", "  queued -> started p95", "ms"),
            Row(f"{m}_ready50", "  ready -> started p50", "ms"),
            Row(f"{m}_ready95", "  ready -> started p95", "ms"),
            Row(f"{m}_refill", "  slot freed -> refilled p50", "ms"),
        ]
    return out


def parse_loop(text: str) -> tuple[tuple[int, int], ...]:
    """``"200@16,30@8"`` -> ((200, 16), (30, 8)): tasks @ parallelism."""
    out: list[tuple[int, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        n, sep, q = part.partition("@")
        try:
            if not sep or int(n) < 1 or int(q) < 1:
                raise ValueError
            out.append((int(n), int(q)))
        except ValueError:
            raise ToolError(f"--loop {text!r}: expected TASKS@PARALLELISM[,...], e.g. 200@16,30@8") from None
    if not out:
        raise ToolError(f"--loop {text!r}: no configuration given")
    return tuple(out)


def rows(cfg: Config) -> list[Row]:
    if cfg.loop_only:
        return loop_rows(cfg)
    p, s, big = cfg.parallelism, cfg.small, cfg.large
    out = [
        Row(f"dispatch_{s}", f"_process_workloads({s}) p{p}", "ms"),
        Row(f"results_{s}", f"all {s} results read p{p}", "ms"),
        Row(f"dispatch_{big}", f"_process_workloads({big}) p{p}", "ms"),
        Row(f"results_{big}", f"all {big} results read p{p}", "ms"),
        Row("throughput", f"throughput {cfg.throughput_n}, {p} in flight", "tasks/s", "higher"),
        Row("recovery_failed", "SIGKILL busy -> key failed", "ms"),
        Row("recovery_syncs", "  sync() calls after death", "calls"),
        Row("recovery_next", "SIGKILL busy -> next runs", "ms"),
    ]
    if cfg.huge:
        out += [
            Row(f"dispatch_{cfg.huge}", f"_process_workloads({cfg.huge}) p{p}", "ms"),
            Row(f"results_{cfg.huge}", f"all {cfg.huge} results read p{p}", "ms"),
        ]
    for q in cfg.scale_parallelism:
        out += [
            Row(f"dispatch_{big}_p{q}", f"_process_workloads({big}) p{q}", "ms"),
            Row(f"results_{big}_p{q}", f"all {big} results read p{q}", "ms"),
        ]
    return out + loop_rows(cfg)


def loop_specs(cfg: Config, r: int) -> list[dict[str, Any]]:
    """The scheduler-loop specs of round ``r``: every configuration, its runs spread over the rounds."""
    specs: list[dict[str, Any]] = []
    mean = (sum(cfg.loop_duration) + sum(cfg.loop_lag)) / 2
    for i, (n, q) in enumerate(cfg.loop):
        runs = cfg.per_round(cfg.loop_runs, (r - i) % cfg.rounds)
        if runs <= 0:
            continue
        ideal = n * mean / q  # every worker busy all the time
        specs.append(
            {
                "id": f"{loop_id(n, q)}@{r}",
                "runs": runs,
                "kind": "loop",
                "n": n,
                "parallelism": q,
                # A stage that is 3x slower than ideal still finishes; one that loses tasks does not.
                "wait": round(max(60.0, 3 * ideal + 10 * cfg.idle_sleep), 1),
                "seed": cfg.loop_seed + 1000 * i + r,
                "idle_sleep": cfg.idle_sleep,
                "loop_cost": cfg.loop_cost,
                "max_tis_per_query": cfg.max_tis_per_query,
                "duration": list(cfg.loop_duration),
                "lag": list(cfg.loop_lag),
            }
        )
    return specs


def plan_round(cfg: Config, r: int) -> dict[str, list[dict[str, Any]]]:
    """Probe specs of round ``r``: ``{"stage": [...], "peers": [...]}``.

    A spec's ``id`` is ``<measurement>@<round>``; its results fill the rows named in
    ``ROW_FIELDS`` for that measurement. Scaling runs are spread over the rounds.
    """
    if cfg.loop_only:
        return {"stage": loop_specs(cfg, r), "peers": []}
    p, s, big = cfg.parallelism, cfg.small, cfg.large
    wait_big = max(20.0, big / 200)
    stage: list[dict[str, Any]] = []
    peers: list[dict[str, Any]] = []

    def add(specs: list[dict[str, Any]], ident: str, runs: int, **spec: Any) -> None:
        if runs > 0:
            specs.append({"id": f"{ident}@{r}", "runs": runs, **spec})

    n_small, n_big = cfg.per_round(cfg.runs, r), cfg.per_round(cfg.runs, r)
    add(stage, f"dispatch_{s}", n_small, kind="dispatch", n=s, parallelism=p, wait=20.0)
    add(stage, f"dispatch_{big}", n_big, kind="dispatch", n=big, parallelism=p, wait=wait_big)
    add(
        stage,
        "throughput",
        cfg.per_round(max(cfg.rounds, 1), r),
        kind="throughput",
        n=cfg.throughput_n,
        parallelism=p,
        wait=max(30.0, cfg.throughput_n / 100),
    )
    add(
        stage,
        "recovery",
        cfg.per_round(max(cfg.rounds, 1), r),
        kind="recovery",
        parallelism=p,
        wait=cfg.recovery_wait,
    )
    scale: list[tuple[str, dict[str, Any]]] = []
    if cfg.huge:
        scale.append(
            (f"dispatch_{cfg.huge}", {"n": cfg.huge, "parallelism": p, "wait": max(60.0, cfg.huge / 200)})
        )
    scale += [
        (f"dispatch_{big}_p{q}", {"n": big, "parallelism": q, "wait": wait_big})
        for q in cfg.scale_parallelism
    ]
    for i, (ident, spec) in enumerate(scale):
        runs = 1 if ident == f"dispatch_{cfg.huge}" else cfg.scale_runs
        # Round-robin the scaling configurations over the rounds, so every round costs alike.
        share = [cfg.per_round(runs, (rr - i) % cfg.rounds) for rr in range(cfg.rounds)]
        add(stage, ident, share[r], kind="dispatch", **spec)
    add(peers, f"ppe_{s}", n_small, kind="ppe", n=s, parallelism=p, throughput=False)
    add(peers, f"ppe_{big}", n_big, kind="ppe", n=big, parallelism=p, throughput=False)
    add(
        peers,
        "ppe_throughput",
        cfg.per_round(max(cfg.rounds, 1), r),
        kind="ppe",
        n=cfg.throughput_n,
        parallelism=p,
        throughput=True,
    )
    add(peers, f"floor_{s}", n_small, kind="floor", n=s)
    add(peers, f"floor_{big}", n_big, kind="floor", n=big)
    return {"stage": stage + loop_specs(cfg, r), "peers": peers}


def row_fields(measurement: str) -> list[tuple[str, str, str]]:
    """(row id, column kind, field of the probe's result) that one measurement feeds.

    Column kind is ``stage`` (the stage's own column), ``ppe`` or ``floor``.
    """
    if measurement.startswith("loop_"):
        return [
            (f"{measurement}_tps", "stage", "tasks_per_s"),
            (f"{measurement}_p50", "stage", "start_p50_ms"),
            (f"{measurement}_p95", "stage", "start_p95_ms"),
            (f"{measurement}_ready50", "stage", "ready_p50_ms"),
            (f"{measurement}_ready95", "stage", "ready_p95_ms"),
            (f"{measurement}_refill", "stage", "refill_p50_ms"),
        ]
    if measurement.startswith("dispatch_"):
        suffix = measurement[len("dispatch_") :]
        return [(measurement, "stage", "dispatch_ms"), (f"results_{suffix}", "stage", "results_ms")]
    if measurement == "throughput":
        return [("throughput", "stage", "tasks_per_s")]
    if measurement == "recovery":
        return [
            ("recovery_failed", "stage", "failed_ms"),
            ("recovery_syncs", "stage", "syncs_to_failed"),
            ("recovery_next", "stage", "next_ms"),
        ]
    if measurement == "ppe_throughput":
        return [("throughput", "ppe", "tasks_per_s")]
    if measurement.startswith("ppe_"):
        return [(f"results_{measurement[4:]}", "ppe", "results_ms")]
    if measurement.startswith("floor_"):
        return [(f"dispatch_{measurement[6:]}", "floor", "dispatch_ms")]
    raise ValueError(f"unknown measurement {measurement!r}")


# --------------------------------------------------------------------------------------
# Samples -> cells -> table
# --------------------------------------------------------------------------------------


@dataclass
class Cell:
    samples: list[float] = field(default_factory=list)
    # Runs that produced no figure: "hang: ...", "never: ...", "n/a: ...", "error: ..."
    outcomes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": [round(x, 3) for x in self.samples]}
        if self.outcomes:
            out["outcomes"] = self.outcomes
        if self.samples:
            out.update(
                median=round(median(self.samples), 3),
                p25=round(quantile(self.samples, 0.25), 3),
                p75=round(quantile(self.samples, 0.75), 3),
                n=len(self.samples),
            )
        return out

    @property
    def value(self) -> float | None:
        return median(self.samples) if self.samples else None

    @property
    def word(self) -> str:
        """What to print instead of a number: the first word of the first outcome."""
        return self.outcomes[0].split(":", 1)[0] if self.outcomes else "-"


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile; exact for one sample."""
    ordered = sorted(xs)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


class Results:
    """Cells by (row, column); columns are stage numbers as strings, ``ppe`` and ``floor``."""

    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], Cell] = {}
        self.blocked: set[tuple[str, str]] = set()  # (measurement, column) not worth retrying
        # Per-run bookkeeping a probe reports besides the figures (the scheduler loop's iterations):
        # {column: {measurement: [run, ...]}}, kept for the JSON.
        self.details: dict[str, dict[str, list[Any]]] = {}

    def cell(self, row: str, column: str) -> Cell:
        return self.cells.setdefault((row, column), Cell())

    def add(self, column: str, result: dict[str, Any]) -> None:
        """Fold one probe result (``{"id": "m@r", field: [samples], ...}``) into the cells.

        A measurement that produced no figure at all is not tried again in later rounds
        (base deadlocking on a big batch stays deadlocked); one that hung after some runs is
        (an intermittent hang is counted, and the samples before it are kept).
        """
        measurement = result["id"].split("@", 1)[0]
        outcome = result.get("outcome", "")
        if result.get("loops"):
            self.details.setdefault(column, {}).setdefault(measurement, []).extend(result["loops"])
        measured = False
        for row, kind, fld in row_fields(measurement):
            cell = self.cell(row, column if kind == "stage" else kind)
            values = result.get(fld, [])
            cell.samples.extend(float(v) for v in values if v is not None)
            measured = measured or any(v is not None for v in values)
            if any(v is None for v in values):
                # Only recovery reports None: the executor never got there within the wait.
                cell.outcomes.append(f"never: not within {result.get('wait_s', 0):g}s of the SIGKILL")
            if outcome:
                cell.outcomes.append(outcome)
        if not measured:
            self.blocked.add((measurement, column))

    def value(self, row: str, column: str) -> float | None:
        cell = self.cells.get((row, column))
        return cell.value if cell else None


def fmt_number(x: float) -> str:
    if x >= 1000:
        return f"{x:.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def render(results: Results, table_rows: list[Row], columns: list[tuple[str, str]]) -> str:
    """Rows x columns; each cell ``median (ratio to base)``, ``!`` when some runs gave no figure."""
    header_cells = [title for _, title in columns]
    body: list[list[str]] = []
    for row in table_rows:
        base = results.value(row.id, BASE)
        line: list[str] = []
        for col, _ in columns:
            cell = results.cells.get((row.id, col))
            if cell is None:
                line.append("")
                continue
            if cell.value is None:
                line.append(cell.word)
                continue
            r = ratio(cell.value, base)
            mark = "!" if cell.outcomes else ""
            line.append(f"{fmt_number(cell.value)} ({'-' if r is None else f'{r:.2f}'}){mark}")
        body.append(line)
    return _labelled(header_cells, [f"{r.label} ({r.unit})" for r in table_rows], body)


def _labelled(header: list[str], labels: list[str], body: list[list[str]]) -> str:
    """The figures right-aligned, each row after its label and a space."""
    width = max(map(len, labels)) + 1
    lines = table.render([header, *body], right=range(len(header)), strip=False)
    return "\n".join(label.ljust(width) + line for label, line in zip(["", *labels], lines, strict=True))


def render_spread(results: Results, table_rows: list[Row], columns: list[tuple[str, str]]) -> str:
    """IQR of each cell as +-% of its median, and how many samples it had."""
    header = [title for _, title in columns]
    body: list[list[str]] = []
    kept: list[Row] = []
    for row in table_rows:
        line = []
        for col, _ in columns:
            cell = results.cells.get((row.id, col))
            if cell is None or cell.value is None or not cell.value:
                line.append("")
                continue
            spread = (quantile(cell.samples, 0.75) - quantile(cell.samples, 0.25)) / 2 / cell.value * 100
            line.append(f"±{spread:.0f}% n{len(cell.samples)}")
        if any(line):
            body.append(line)
            kept.append(row)
    if not kept:
        return ""
    return _labelled(header, [f"{r.label} ({r.unit})" for r in kept], body)


def targets(results: Results, cfg: Config, last: str) -> list[str]:
    """The issue's targets for the full series, checked on the last stage: one line each."""
    s, big = cfg.small, cfg.large
    noise = 1.10  # a ratio up to this counts as "no slower, within noise" on a shared 2-core box
    lines: list[str] = []

    def check(name: str, ok: bool | None, detail: str) -> None:
        word = "n/a " if ok is None else ("ok  " if ok else "MISS")
        lines.append(f"  {word} {name}: {detail}")

    for row in (f"dispatch_{s}", f"results_{s}"):
        r = ratio(results.value(row, last), results.value(row, BASE))
        check(
            f"{row} <= base", None if r is None else r <= noise, "ratio " + ("-" if r is None else f"{r:.2f}")
        )
    mine, ppe = results.value(f"results_{s}", last), results.value(f"results_{s}", "ppe")
    check(
        f"results_{s} < ProcessPoolExecutor",
        None if mine is None or ppe is None else mine < ppe,
        "-" if mine is None or ppe is None else f"{mine:.1f} ms vs {ppe:.1f} ms",
    )
    r = ratio(results.value("throughput", last), results.value("throughput", BASE))
    check(
        "throughput >= base",
        None if r is None else r >= 1 / noise,
        "ratio " + ("-" if r is None else f"{r:.2f}"),
    )
    syncs = results.value("recovery_syncs", last)
    check(
        "SIGKILL recovered within one sync()",
        None if syncs is None else syncs <= 1.0,
        "-" if syncs is None else f"median {syncs:g} sync() calls",
    )
    base_big = results.cells.get((f"dispatch_{big}", BASE))
    check(
        f"base hangs on {big} in one batch (the bug is real here)",
        None if base_big is None else (base_big.value is None and base_big.word == "hang"),
        "-" if base_big is None else (base_big.word if base_big.value is None else "measured"),
    )
    return lines


def render_loop_details(results: Results, columns: list[tuple[str, str]]) -> str:
    """One line per (loop configuration, column): how the modelled scheduler's iterations went."""
    lines: list[str] = []
    for col, title in columns:
        for measurement, runs in sorted(results.details.get(col, {}).items()):
            if not runs:
                continue
            loops = median([r["loops"] for r in runs])
            idle = median([r["idle"] for r in runs])
            full = median([r["full"] for r in runs])
            in_flight = median([r["max_in_flight"] for r in runs])
            lines.append(
                f"  {measurement} {title}: {loops:.0f} loops, {idle:.0f} idle (slept), "
                f"{full:.0f} with no free slot while tasks waited, at most {in_flight:.0f} queued or running"
            )
    return "\n".join(lines)


def loop_targets(results: Results, cfg: Config, column: str) -> list[str]:
    """Issue 15's targets on the scheduler loop, for one column: throughput >= 0.97x base and
    queued-to-start p95 <= base's, per configuration. Ratios of one interleaved run."""
    lines: list[str] = []
    for n, q in cfg.loop:
        m = loop_id(n, q)
        tps = ratio(results.value(f"{m}_tps", column), results.value(f"{m}_tps", BASE))
        p95 = ratio(results.value(f"{m}_p95", column), results.value(f"{m}_p95", BASE))
        for name, r, ok in (
            (f"{n} tasks p{q}: tasks/s >= 0.97x base", tps, None if tps is None else tps >= 0.97),
            (f"{n} tasks p{q}: queued->started p95 <= base", p95, None if p95 is None else p95 <= 1.0),
        ):
            word = "n/a " if ok is None else ("ok  " if ok else "MISS")
            lines.append(f"  {word} {name}: ratio " + ("-" if r is None else f"{r:.2f}"))
        # Not a target: a stage that queues ahead moves waiting from before queueing to after it,
        # which raises queued->started but not this.
        ready = ratio(results.value(f"{m}_ready95", column), results.value(f"{m}_ready95", BASE))
        lines.append(
            f"  info {n} tasks p{q}: ready->started p95: ratio " + ("-" if ready is None else f"{ready:.2f}")
        )
    return lines


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


@dataclass
class Bench:
    line: Line
    stages: list[Stage]
    cfg: Config
    layout: Layout = DEFAULT
    peers: bool = True
    log: Any = sys.stderr
    results: Results = field(default_factory=Results)

    def columns(self) -> list[tuple[str, str]]:
        cols = [(s.column, s.short) for s in self.stages]
        if self.peers:
            cols += [("ppe", "ProcPool"), ("floor", "floor")]
        return cols

    def run(self) -> Results:
        pythons = {}
        for stage in self.stages:
            t0 = time.monotonic()
            pythons[stage.column] = stage_python(self.line, stage, self.layout)
            print(f"stage {stage.short:>4}: {stage.title} ({time.monotonic() - t0:.1f}s venv)", file=self.log)
        for r in range(self.cfg.rounds):
            plan = plan_round(self.cfg, r)
            order = [(s.column, plan["stage"]) for s in self.stages]
            if self.peers:
                order.append((PEERS, plan["peers"]))
            for column, specs in order:
                specs = [s for s in specs if (s["id"].split("@")[0], column) not in self.results.blocked]
                if not specs:
                    continue
                t0 = time.monotonic()
                python = pythons[BASE if column == PEERS else column]
                budget = self.budget(specs)
                request = {"specs": specs, "stuck_after": self.cfg.stuck_after, "deadline": budget - 30}
                payload = run_probe(python, PROBE, request, timeout=budget, layout=self.layout)
                if "error" in payload:
                    for spec in specs:
                        self.results.add(column, {"id": spec["id"], "outcome": "error: " + payload["error"]})
                else:
                    for result in payload["results"]:
                        self.results.add(column, result)
                name = "peers" if column == PEERS else f"stage {column}"
                print(f"round {r + 1}/{self.cfg.rounds} {name}: {time.monotonic() - t0:.1f}s", file=self.log)
        return self.results

    def budget(self, specs: list[dict[str, Any]]) -> float:
        return 120.0 + sum(float(s.get("wait", 10.0)) * max(1, int(s.get("runs", 1))) for s in specs)

    def to_json(self, seconds: float, argv: Sequence[str]) -> dict[str, Any]:
        table_rows = rows(self.cfg)
        return {
            "line": self.line.name,
            "version": self.line.version,
            "command": " ".join(["python -m tools bench", *argv]),
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.cfg).items()},
            "seconds": round(seconds, 1),
            "stages": [
                {
                    "k": s.k,
                    "column": s.column,
                    "patch": s.title,
                    "sha256": fetch.sha256_bytes(s.source),
                    **({"extra": True} if s.label else {}),
                }
                for s in self.stages
            ],
            "rows": [
                {
                    "id": row.id,
                    "label": row.label,
                    "unit": row.unit,
                    "better": row.better,
                    "cells": {
                        col: {
                            **cell.summary(),
                            "ratio_to_base": _round(ratio(cell.value, self.results.value(row.id, BASE))),
                        }
                        for (rid, col), cell in sorted(self.results.cells.items())
                        if rid == row.id
                    },
                }
                for row in table_rows
            ],
            "details": self.results.details,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = Config.quick() if args.quick else Config()
    if args.runs is not None:
        cfg.runs = args.runs
    if args.rounds is not None:
        cfg.rounds = args.rounds
    cfg.loop_only = bool(getattr(args, "loop_only", False))
    if getattr(args, "loop", None):
        cfg.loop = parse_loop(args.loop)
    if getattr(args, "loop_runs", None) is not None:
        cfg.loop_runs = args.loop_runs
    if getattr(args, "idle_sleep", None) is not None:
        cfg.idle_sleep = args.idle_sleep
    if getattr(args, "loop_cost", None) is not None:
        cfg.loop_cost = args.loop_cost
    if getattr(args, "no_loop", False):
        if cfg.loop_only:
            raise ToolError("--no-loop and --loop-only exclude each other")
        cfg.loop = ()
    # Every round must have something to run: at most as many rounds as the samples they share.
    cfg.rounds = max(1, min(cfg.rounds, cfg.loop_runs if cfg.loop_only else cfg.runs))
    return cfg


def run_bench(args: argparse.Namespace, layout: Layout = DEFAULT) -> int:
    line: Line = args.line
    cfg = config_from_args(args)
    stages = load_stages(line, parse_stages(args.stages))
    extras = [parse_extra(text) for text in args.extra or []]
    names = [e.column for e in extras]
    if len(set(names)) != len(names):
        raise ToolError("--extra: two columns with the same NAME")
    stages += extras
    bench = Bench(line, stages, cfg, layout, peers=not (args.no_peers or cfg.loop_only))
    started = time.monotonic()
    bench.run()
    seconds = time.monotonic() - started
    table_rows = [r for r in rows(cfg) if any(rid == r.id for rid, _ in bench.results.cells)]
    columns = bench.columns()
    if cfg.loop_only:
        print(
            f"\nbench {line.name} ({line.version}), fork, scheduler loop only; {cfg.loop_runs} run(s) per "
            f"configuration over {cfg.rounds} interleaved round(s); {seconds:.0f}s"
        )
    else:
        print(
            f"\nbench {line.name} ({line.version}), fork, no-op tasks; {cfg.runs} samples per dispatch "
            f"figure over {cfg.rounds} interleaved rounds; {seconds:.0f}s"
        )
    if cfg.loop:
        lo, hi = cfg.loop_duration
        print(
            f"scheduler loop: tasks {lo:g}-{hi:g} s + {cfg.loop_lag[0]:g}-{cfg.loop_lag[1]:g} s supervisor "
            f"lag (seeded), idle sleep {cfg.idle_sleep:g} s, {cfg.loop_cost * 1000:g} ms of scheduling "
            f"per loop, max_tis_per_query {cfg.max_tis_per_query}"
        )
    print("median (ratio to base in this run; < 1 is faster, except throughput and tasks/s)\n")
    print(render(bench.results, table_rows, columns))
    spread = render_spread(bench.results, table_rows, columns)
    if spread:
        print("\nspread: half the interquartile range, as % of the median; n samples\n")
        print(spread)
    details = render_loop_details(bench.results, columns)
    if details:
        print("\nscheduler loop iterations (median of runs):")
        print(details)
    print("\ncolumns: " + "; ".join(f"{s.short} = {s.title}" for s in stages))
    print("! = some runs of this cell produced no figure; why, per cell:")
    for (row, col), cell in sorted(bench.results.cells.items()):
        for outcome, count in sorted(Counter(cell.outcomes).items()):
            name = "base" if col == BASE else col
            print(f"  {row} [{name}] x{count}: {outcome}")
    last = [s for s in stages if not s.label][-1]
    if last.k and not cfg.loop_only:
        print(f"\ntargets on stage {last.k} (ratio <= 1.10 counts as no slower, within noise):")
        print("\n".join(targets(bench.results, cfg, last.column)))
    if cfg.loop:
        for stage in [last, *extras] if last.k else extras:
            print(f"\nissue 15 targets on the scheduler loop, {stage.short}:")
            print("\n".join(loop_targets(bench.results, cfg, stage.column)))
    out = args.json or layout.build / "bench" / f"{line.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = sys.argv[2:] if sys.argv[1:2] == ["bench"] else []
    out.write_text(json.dumps(bench.to_json(seconds, argv), indent=1) + "\n")
    print(f"\nJSON: {layout.rel(out)}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="dispatch cost, throughput and recovery per stage, as ratios to base")
    p.add_argument(
        "--line", type=pins.line_arg, default=pins.PRIMARY.name, help="release line (default %(default)s)"
    )
    p.add_argument("--stages", help="stages to measure, e.g. 0,3,5-8 (default: all; base is always included)")
    p.add_argument("--runs", type=int, help="samples per dispatch figure and stage (default 20; --quick 3)")
    p.add_argument("--rounds", type=int, help="interleaved round-robin passes (default 2)")
    p.add_argument("--quick", action="store_true", help="a small smoke configuration (about a minute)")
    p.add_argument("--no-peers", action="store_true", help="skip ProcessPoolExecutor and the pipe floor")
    p.add_argument(
        "--loop-only", action="store_true", help="only the scheduler-loop figure (tasks/s, queued->started)"
    )
    p.add_argument("--no-loop", action="store_true", help="skip the scheduler-loop figure")
    p.add_argument("--loop", help="scheduler-loop configurations TASKS@PARALLELISM,... (default 200@16,30@8)")
    p.add_argument("--loop-runs", type=int, help="runs of each loop configuration (default 2; --quick 1)")
    p.add_argument("--idle-sleep", type=float, help="scheduler_idle_sleep_time of the loop model (default 1)")
    p.add_argument("--loop-cost", type=float, help="seconds of scheduling work per loop (default 0.02)")
    p.add_argument(
        "--extra",
        action="append",
        metavar="NAME=PATH",
        help="measure this local_executor.py as one more column NAME (repeatable)",
    )
    p.add_argument("--json", type=Path, help="where to write the JSON (default build/bench/<line>.json)")
    p.set_defaults(func=run_bench)

"""Options of ``python -m tools e2e``: defaults, repeats, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.delivery import package
from tools.measure.e2e import cli, driver
from tools.measure.e2e.driver import DEFAULT_SCENARIOS, SCENARIOS, Options
from tools.shared.errors import ToolError


def _parse(*argv: str) -> Options:
    return cli.parse_options(list(argv))


def test_defaults_are_the_full_series_on_the_primary_line() -> None:
    o = _parse()
    assert (o.line.name, o.stage, o.db, o.parallelism) == ("3.3", None, "sqlite", 8)
    assert o.scenarios == list(DEFAULT_SCENARIOS)
    assert "kill-orphan" in SCENARIOS and "kill-orphan" not in DEFAULT_SCENARIOS


def test_options_repeatable_scenarios_and_versions() -> None:
    o = _parse(
        "--scenario",
        "kill-queued",
        "--scenario",
        "clean",
        "--scenario",
        "kill-queued",
        "--line",
        "3.2.1",
        "--stage",
        "0",
        "--db",
        "postgres",
    )
    assert o.scenarios == ["kill-queued", "clean"]
    assert (o.line.name, o.stage, o.db) == ("3.2", 0, "postgres")


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(ToolError, match=r"unknown release line '2\.9'"):
        _parse("--line", "2.9")
    with pytest.raises(ToolError, match="--stage must be >= 0"):
        _parse("--stage", "-1")


def test_trace_loops_is_off_unless_asked_for() -> None:
    assert not _parse().trace_loops
    assert _parse("--trace-loops", "--scenario", "throughput").trace_loops


def test_airflow_env_pairs_later_ones_winning() -> None:
    assert _parse().airflow_env == {}
    o = _parse(
        "--airflow-env",
        "AIRFLOW__LOCAL_EXECUTOR__PREFETCH_FRACTION=0",
        "--airflow-env",
        "AIRFLOW__LOCAL_EXECUTOR__PREFETCH_FRACTION=0.5",
        "--airflow-env",
        "EMPTY=",
    )
    assert o.airflow_env == {"AIRFLOW__LOCAL_EXECUTOR__PREFETCH_FRACTION": "0.5", "EMPTY": ""}
    with pytest.raises(ToolError, match=r"--airflow-env wants NAME=VALUE .* not 'PREFETCH'"):
        _parse("--airflow-env", "PREFETCH")
    with pytest.raises(ToolError, match=r"not '=1'"):
        _parse("--airflow-env", "=1")


def test_executor_package_sets_the_class_and_excludes_stages(tmp_path: Path) -> None:
    assert _parse().executor == "overlay"
    assert "AIRFLOW__CORE__EXECUTOR" not in driver.scenario_env(_parse(), "clean", driver.MAIN_DAG, tmp_path)
    o = _parse("--executor", "package", "--line", "3.2")
    assert (o.executor, o.line.name, o.stage) == ("package", "3.2", None)
    env = driver.scenario_env(o, "clean", driver.MAIN_DAG, tmp_path)
    assert env["AIRFLOW__CORE__EXECUTOR"] == package.EXECUTOR_CLASS
    for extra in (["--stage", "0"], ["--compare-stages", "0,full"], ["--supervisor", "full"]):
        with pytest.raises(ToolError, match="--executor package runs the full series' wheel"):
            _parse("--executor", "package", *extra)

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
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=0",
        "--airflow-env",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=0.5",
        "--airflow-env",
        "EMPTY=",
    )
    assert o.airflow_env == {"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5", "EMPTY": ""}
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


def test_core_a_release_the_line_covers_runs_with_the_task_sdk_it_requires() -> None:
    o = _parse()
    assert (o.release, o.task_sdk) == ("3.3.2", "1.3.2")  # the line's pinned pair
    o = _parse("--core", "3.3.0", "--scenario", "clean")
    assert (o.line.name, o.core, o.release, o.task_sdk, o.executor) == (
        "3.3",
        "3.3.0",
        "3.3.0",
        "1.3.0",
        "overlay",
    )
    assert _parse("--core", "3.3.2").task_sdk == "1.3.2"
    assert _parse("--core", "3.3.1", "--stage", "0").stage == 0
    assert _parse("--core", "3.3.1", "--compare-stages", "0,full").compare == [0, None]
    # the 3.1 wheel admits task-sdk 1.1.6-1.1.8: core 3.1.6 installs it with its own task-sdk
    o = _parse("--line", "3.1", "--core", "3.1.6", "--executor", "package")
    assert (o.line.name, o.release, o.task_sdk, o.executor) == ("3.1", "3.1.6", "1.1.6", "package")


def test_core_not_covered_by_the_line_is_one_line_naming_the_line_and_its_releases() -> None:
    with pytest.raises(ToolError) as info:
        _parse("--core", "3.2.2")
    assert str(info.value) == (
        "--core 3.2.2: not a release line 3.3 covers (apache-airflow-core 3.3.0, 3.3.1, 3.3.2); "
        "3.2.2 is line 3.2's: add --line 3.2"
    )
    with pytest.raises(ToolError) as info:
        _parse("--line", "3.1", "--core", "3.1.3")  # ships another local_executor.py: no line covers it
    assert str(info.value) == (
        "--core 3.1.3: not a release line 3.1 covers (apache-airflow-core 3.1.5, 3.1.6, 3.1.7, 3.1.8)"
    )
    assert "\n" not in str(info.value)


def test_core_with_the_package_is_refused_where_pip_refuses_the_pair() -> None:
    with pytest.raises(ToolError) as info:
        _parse("--core", "3.3.0", "--executor", "package")
    assert str(info.value) == (
        "--executor package --core 3.3.0: the 3.3 wheel requires apache-airflow-task-sdk 1.3.2 and "
        "apache-airflow-core 3.3.0 requires 1.3.0, a pair pip refuses; run the overlay there "
        "(--executor overlay --core 3.3.0) or the wheel on --core 3.3.2"
    )
    with pytest.raises(ToolError, match=r"or the wheel on --core 3\.1\.6, 3\.1\.7 or 3\.1\.8$"):
        _parse("--line", "3.1", "--core", "3.1.5", "--executor", "package")


def test_core_runs_the_release_as_shipped_or_the_full_series_only() -> None:
    for extra in (["--stage", "2"], ["--compare-stages", "0,5"], ["--supervisor", "0"]):
        with pytest.raises(
            ToolError, match=r"^--core 3\.3\.1: stage 0 \(the release as shipped\) or the full"
        ):
            _parse("--core", "3.3.1", *extra)
    assert _parse("--core", "3.3.2", "--stage", "2").stage == 2  # the pinned release has every stage


def test_e2e_lock_core_needs_one_line_and_a_release_it_covers() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_commands(parser.add_subparsers())
    with pytest.raises(ToolError, match=r"^e2e-lock --core needs exactly one --line$"):
        cli._cmd_e2e_lock(parser.parse_args(["e2e-lock", "--core", "3.3.0"]))
    with pytest.raises(ToolError, match=r"^--core 3\.2\.2: not a release line 3\.3 covers"):
        cli._cmd_e2e_lock(parser.parse_args(["e2e-lock", "--line", "3.3", "--core", "3.2.2"]))

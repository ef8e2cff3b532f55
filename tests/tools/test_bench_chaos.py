"""The pure parts of ``tools.measure.bench`` and ``tools.measure.chaos``: plans, ratios, tables,
schedules, invariants.

Nothing here starts an executor: the probes that do run inside stage venvs and are
exercised by ``nox -s bench -- --quick`` and ``nox -s chaos``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tools.measure import bench, chaos
from tools.shared.errors import ToolError
from tools.shared.pins import PRIMARY

# --------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------


def test_parse_stages():
    assert bench.parse_stages(None) is None
    assert bench.parse_stages("all") is None
    assert bench.parse_stages("0,3,5-7") == [0, 3, 5, 6, 7]
    assert bench.parse_stages("8,1,1") == [1, 8]
    with pytest.raises(ToolError, match="--stages"):
        bench.parse_stages("two")


def test_quantiles_and_ratio():
    assert bench.median([3, 1, 2]) == 2
    assert bench.quantile([1, 2, 3, 4, 5], 0.25) == 2
    assert bench.quantile([7], 0.75) == 7
    assert bench.ratio(18.0, 9.0) == 2.0
    assert bench.ratio(None, 9.0) is None
    assert bench.ratio(5.0, None) is None


def test_rounds_share_the_runs_and_ids_are_unique():
    cfg = bench.Config(runs=20, rounds=3)
    assert sum(cfg.per_round(20, r) for r in range(3)) == 20
    ids: list[str] = []
    per_measurement: dict[str, int] = {}
    for r in range(cfg.rounds):
        plan = bench.plan_round(cfg, r)
        for spec in plan["stage"] + plan["peers"]:
            ids.append(spec["id"])
            name = spec["id"].split("@")[0]
            per_measurement[name] = per_measurement.get(name, 0) + spec["runs"]
            # Every measurement feeds at least one row of the table.
            assert bench.row_fields(name)
    assert len(ids) == len(set(ids))
    assert per_measurement["dispatch_200"] == 20
    assert per_measurement["dispatch_2000"] == 20
    assert per_measurement["dispatch_20000"] == 1  # the huge batch runs once, in one round
    assert per_measurement["dispatch_2000_p32"] == cfg.scale_runs


def test_quick_config_is_small():
    cfg = bench.Config.quick()
    plan = bench.plan_round(cfg, 0)
    assert all(spec.get("n", 0) <= 1000 for spec in plan["stage"] + plan["peers"])
    assert {r.id for r in bench.rows(cfg)} >= {"dispatch_200", "throughput", "recovery_failed"}


def _results() -> bench.Results:
    res = bench.Results()
    res.add(
        "0", {"id": "dispatch_200@0", "dispatch_ms": [10.0, 12.0, 11.0], "results_ms": [20.0, 22.0, 21.0]}
    )
    res.add("0", {"id": "dispatch_2000@0", "outcome": "hang: run_measurements deadlocked after 3.1s"})
    res.add(
        "0",
        {"id": "recovery@0", "failed_ms": [None], "next_ms": [15.0], "syncs_to_failed": [None], "wait_s": 3},
    )
    res.add("3", {"id": "dispatch_200@0", "dispatch_ms": [5.0, 6.0], "results_ms": [10.0, 11.0]})
    res.add("3", {"id": "dispatch_2000@0", "dispatch_ms": [50.0], "results_ms": [60.0]})
    res.add(
        "3", {"id": "recovery@0", "failed_ms": [4.0], "next_ms": [7.0], "syncs_to_failed": [1], "wait_s": 3}
    )
    res.add("peers", {"id": "ppe_200@0", "results_ms": [25.0]})
    res.add("peers", {"id": "floor_200@0", "dispatch_ms": [3.0]})
    return res


def test_results_fold_samples_outcomes_and_peers():
    res = _results()
    assert res.value("dispatch_200", "0") == 11.0
    assert res.value("results_200", "ppe") == 25.0  # peers land in their own columns
    assert res.value("dispatch_200", "floor") == 3.0
    base_big = res.cells[("dispatch_2000", "0")]
    assert base_big.value is None and base_big.word == "hang"
    # A measurement with no figure at all is not retried; one with some figures is.
    assert ("dispatch_2000", "0") in res.blocked
    assert ("recovery", "0") not in res.blocked
    assert res.cells[("recovery_failed", "0")].word == "never"
    assert res.value("recovery_next", "0") == 15.0


def test_intermittent_hang_keeps_samples_and_is_marked():
    res = bench.Results()
    res.add(
        "2", {"id": "dispatch_200@0", "dispatch_ms": [9.0], "results_ms": [19.0], "outcome": "hang: end()"}
    )
    res.add("0", {"id": "dispatch_200@0", "dispatch_ms": [9.0], "results_ms": [19.0]})
    assert ("dispatch_200", "2") not in res.blocked
    table = bench.render(res, [bench.Row("dispatch_200", "d200", "ms")], [("0", "base"), ("2", "2")])
    assert "9.00 (1.00)!" in table


def test_render_shows_ratios_to_base_and_words():
    res = _results()
    cfg = bench.Config()
    columns = [("0", "base"), ("3", "3"), ("ppe", "ProcPool"), ("floor", "floor")]
    table_rows = [r for r in bench.rows(cfg) if any(rid == r.id for rid, _ in res.cells)]
    table = bench.render(res, table_rows, columns)
    lines = {line.split(" (")[0].strip(): line for line in table.splitlines()[1:]}
    assert "11.0 (1.00)" in lines["_process_workloads(200) p4"]
    assert "5.50 (0.50)" in lines["_process_workloads(200) p4"]
    assert "3.00 (0.27)" in lines["_process_workloads(200) p4"]
    assert "hang" in lines["_process_workloads(2000) p4"]
    assert "50.0 (-)" in lines["_process_workloads(2000) p4"]
    assert "never" in lines["SIGKILL busy -> key failed"]
    spread = bench.render_spread(res, table_rows, columns)
    assert "n3" in spread


def test_targets_judge_the_last_stage():
    lines = "\n".join(bench.targets(_results(), bench.Config(), "3"))
    assert "ok   dispatch_200 <= base: ratio 0.50" in lines
    assert "ok   results_200 < ProcessPoolExecutor" in lines
    assert "ok   SIGKILL recovered within one sync()" in lines
    assert "ok   base hangs on 2000" in lines
    assert "n/a  throughput" in lines


def test_bench_json_shape():
    stages = [bench.Stage(0, "base", b"a"), bench.Stage(3, "0003-x.patch", b"b")]
    b = bench.Bench(PRIMARY, stages, bench.Config(), results=_results())
    doc = json.loads(json.dumps(b.to_json(12.3, ["--runs", "3"])))
    assert doc["line"] == PRIMARY.name and doc["command"] == "python -m tools bench --runs 3"
    assert [s["k"] for s in doc["stages"]] == [0, 3]
    row = next(r for r in doc["rows"] if r["id"] == "dispatch_200")
    assert row["unit"] == "ms" and row["better"] == "lower"
    assert row["cells"]["0"]["median"] == 11.0 and row["cells"]["0"]["ratio_to_base"] == 1.0
    assert row["cells"]["3"]["ratio_to_base"] == 0.5
    assert row["cells"]["3"]["samples"] == [5.0, 6.0]
    big = next(r for r in doc["rows"] if r["id"] == "dispatch_2000")
    assert big["cells"]["0"]["outcomes"][0].startswith("hang")
    assert big["cells"]["0"]["ratio_to_base"] is None


# --------------------------------------------------------------------------------------
# chaos: schedules
# --------------------------------------------------------------------------------------


def test_schedule_is_a_pure_function_of_seed_and_run():
    assert chaos.schedule(7, 3) == chaos.schedule(7, 3)
    assert json.loads(json.dumps(chaos.schedule(7, 3))) == chaos.schedule(7, 3)
    assert chaos.schedule(7, 3) != chaos.schedule(7, 4)
    assert chaos.schedule(7, 3) != chaos.schedule(8, 3)


def test_schedules_cover_the_fault_space_within_bounds():
    schedules = [chaos.schedule(2026, r) for r in range(300)]
    kinds = {f["kind"] for s in schedules for f in s["faults"]}
    assert kinds == set(chaos.KINDS)
    assert {s["start_method"] for s in schedules} == {"fork", "spawn"}
    assert {s["dispatch"] for s in schedules} == {"one_batch", "slots", "chunks"}
    for s in schedules:
        assert 0 < s["late_from"] <= len(s["tasks"])
        assert all(f["at_ms"] < s["late_ms"] for f in s["faults"])
        for t in s["tasks"]:
            assert chaos.KIB <= t["pad"] <= 256 * chaos.KIB
            assert t["fail_bytes"] == 0 or chaos.KIB <= t["fail_bytes"] <= 256 * chaos.KIB
        assert len({t["task_id"] for t in s["tasks"]}) == len(s["tasks"])
    sizes = [t["pad"] for s in schedules for t in s["tasks"]]
    assert min(sizes) < 4 * chaos.KIB and max(sizes) > 128 * chaos.KIB


def test_parse_replay():
    assert chaos.parse_replay("2026:5") == (2026, 5)
    with pytest.raises(ToolError, match="SEED:RUN"):
        chaos.parse_replay("2026")


# --------------------------------------------------------------------------------------
# chaos: invariants over fake observations
# --------------------------------------------------------------------------------------


def _sched() -> dict[str, Any]:
    tasks = [
        {"task_id": "a", "pad": 2048, "fail_bytes": 0, "sleep_ms": 0},
        {"task_id": "b", "pad": 2048, "fail_bytes": 4096, "sleep_ms": 0},
        {"task_id": "c", "pad": 2048, "fail_bytes": 0, "sleep_ms": 100},
    ]
    return {"seed": 1, "run": 2, "tasks": tasks, "faults": [], "end_bound_s": 5.0}


def _obs(**over: Any) -> dict[str, Any]:
    obs: dict[str, Any] = {
        "run": 2,
        "dispatched": ["a", "b", "c"],
        "not_taken": [],
        "events": [["a", "success", None, 0.1], ["b", "failed", "b", 0.1], ["c", "success", None, 0.2]],
        "tokens": [["b", "b"]],
        "faults": [],
        "started": [["a", 11], ["b", 12], ["c", 11]],
        "done": [["a", 11], ["b", 12], ["c", 11]],
        "end_s": 0.1,
    }
    obs.update(over)
    return obs


def test_a_clean_run_passes():
    v = chaos.check(_sched(), _obs())
    assert v.ok, v.problems()
    assert v.ref == "1:2"


def test_a_key_never_reported_is_lost():
    obs = _obs(events=[["a", "success", None, 0.1], ["b", "failed", "b", 0.1]])
    v = chaos.check(_sched(), obs)
    assert v.lost == ["c: dispatched, never reported (no fault explains it)"]
    assert not v.ok


def test_a_killed_busy_worker_may_lose_its_key_only_as_failed():
    kill = {"kind": "kill_running", "at_ms": 50, "pick": 0, "fired_ms": 51.0, "pid": 11, "task": "c"}
    reported = _obs(
        faults=[kill],
        events=[["a", "success", None, 0.1], ["b", "failed", "b", 0.1], ["c", "failed", None, 0.3]],
        done=[["a", 11], ["b", 12]],
    )
    assert chaos.check(_sched(), reported).ok
    silent = _obs(faults=[kill], events=[["a", "success", None, 0.1], ["b", "failed", "b", 0.1]])
    v = chaos.check(_sched(), silent)
    assert v.lost == ["c: dispatched, never reported (its worker was killed)"]
    assert v.faults == [kill]


def test_failed_without_a_fault_is_misattributed():
    obs = _obs(events=[["a", "failed", None, 0.1], ["b", "failed", "b", 0.1], ["c", "success", None, 0.2]])
    v = chaos.check(_sched(), obs)
    assert v.misattributed == ["a: expected success, reported failed (it ran to completion on a live worker)"]


def test_success_for_a_failing_task_is_misattributed_even_after_a_kill():
    kill = {"kind": "kill_running", "at_ms": 5, "pick": 0, "fired_ms": 6.0, "pid": 12, "task": "b"}
    obs = _obs(
        faults=[kill],
        events=[["a", "success", None, 0.1], ["b", "success", None, 0.1], ["c", "success", None, 0.2]],
    )
    assert chaos.check(_sched(), obs).misattributed == ["b: expected failed, reported success"]


def test_tokens_of_another_key_are_misattributed():
    wrong_event = _obs(
        events=[["a", "success", None, 0.1], ["b", "failed", "a", 0.1], ["c", "success", None, 0.2]]
    )
    assert chaos.check(_sched(), wrong_event).misattributed == ["b: reported failed with the exception of a"]
    wrong_message = _obs(tokens=[["b", "c"]])
    assert chaos.check(_sched(), wrong_message).misattributed == ["b's exception arrived in a result for c"]


def test_two_terminal_states_and_unknown_keys():
    obs = _obs(events=[*_obs()["events"], ["a", "failed", None, 0.5], ["zz", "success", None, 0.6]])
    problems = chaos.check(_sched(), obs).misattributed
    assert "a: reported 2 times (success, failed)" in problems
    assert "zz: reported success but was never dispatched" in problems


def test_sigterm_mid_batch_excuses_keys_never_taken_or_never_run():
    term = {"kind": "sigterm", "at_ms": 10, "pick": 0, "fired_ms": 11.0, "mid_batch": True}
    obs = _obs(
        faults=[term],
        terminated=True,
        dispatched=["a", "b", "c"],
        not_taken=["c"],
        events=[["a", "success", None, 0.1], ["b", "failed", None, 0.2]],
        started=[["a", 11]],
        done=[["a", 11]],
        tokens=[],
    )
    v = chaos.check(_sched(), obs)
    assert v.ok, v.problems()  # c was never taken; b never ran and was reported failed


def test_hang_and_slow_end_and_errors():
    hung = chaos.check(_sched(), {"run": 2, "hang": "hang: chaos_runs deadlocked after 3.0s", "faults": []})
    assert hung.hang.startswith("hang") and not hung.ok
    slow = chaos.check(_sched(), _obs(end_s=9.5))
    assert slow.end_slow == "end() took 9.5s, bound 5s"
    raised = chaos.check(_sched(), _obs(error="Traceback...\nEOFError: Ran out of input\n"))
    assert raised.error == "error: the executor raised: EOFError: Ran out of input"


def test_skipped_faults_are_not_counted():
    skipped = {"kind": "kill_idle", "at_ms": 5, "pick": 0, "skipped": "the run was over"}
    assert chaos.check(_sched(), _obs(faults=[skipped])).faults == []


def test_chaos_table_and_json():
    stage = bench.Stage(8, "0008-x.patch", b"")
    good = chaos.check(_sched(), _obs())
    kill = {"kind": "kill_idle", "at_ms": 5, "pick": 0, "fired_ms": 6.0, "pid": 13, "task": None}
    bad = chaos.check(_sched(), _obs(faults=[kill], events=[]))
    summary = chaos.StageSummary(stage, [good, bad], 3.0)
    assert summary.lost == 3 and not summary.ok and summary.failing == [bad]
    table = chaos.render([summary])
    header, row = table.splitlines()
    assert header.split() == [
        "stage",
        "runs",
        "faults",
        "(idle/run/write/term)",
        "hangs",
        "lost",
        "misattr",
        "end>bound",
        "errors",
    ]
    assert row.split() == ["8", "2", "1", "(1/0/0/0)", "0", "3", "0", "0", "0"]
    doc = json.loads(json.dumps(summary.to_json()))
    assert doc["lost_keys"] == 3 and doc["faults"] == {"kill_idle": 1}
    assert [v["run"] for v in doc["verdicts"]] == ["1:2", "1:2"]

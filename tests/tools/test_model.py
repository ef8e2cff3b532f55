"""tools.measure.model without spin: reading pan's report and trails, judging a run, the overlay hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.measure import model
from tools.shared.errors import ToolError
from tools.shared.layout import Layout

PAN_CLEAN = """\
(Spin Version 6.5.2 -- 6 December 2019)
\t+ Partial Order Reduction

Full statespace search for:
\tassertion violations\t+
\tinvalid end states\t+

State-vector 180 byte, depth reached 245, errors: 0
  2137593 states, stored
  1721208 states, matched
  3858801 transitions (= stored+matched)
pan: elapsed time 4.17 seconds
"""

PAN_DEADLOCK = """\
pan:1: invalid end state (at depth 78)
pan: wrote stage0.pml.trail
State-vector 172 byte, depth reached 79, errors: 1
       61 states, stored
       61 transitions (= stored+matched)
pan: elapsed time 0 seconds
"""

PAN_ASSERT = """\
pan:1: assertion violated (ranby[k]==0) (at depth 56)
State-vector 148 byte, depth reached 56, errors: 1
       46 states, stored
"""

PAN_OOM = """\
pan: reached -DMEMLIM bound
\t4.29497e+09 bytes used
State-vector 180 byte, depth reached 361, errors: 0
 27332716 states, stored
pan: elapsed time 77.9 seconds
"""

TRAIL = """\
  1:\tproc  1 (Executor:1) m.pml:10 (state 1)\t[i = 0]
Starting Worker with pid 2
  2:\tproc  1 (Executor:1) m.pml:12 (state 2)\t[wpid[i] = run Worker(i,gen[i])]
  3:\tproc  2 (Worker:1) m.pml:20 (state 5)\t[((plen[0]>0))]
  3:\tproc  2 (Worker:1) m.pml:20 (state 6)\t[need = 2]
  4:\tproc  1 (Executor:1) m.pml:30 (state 9)\t[((rem>0))]
  4:\tproc  1 (Executor:1) m.pml:30 (state 9)\t[plen[0] = (plen[0]+n)]
  4:\tproc  1 (Executor:1) pipes.pml:31 (state 10)\t[rem = (rem-n)]
  5:\tproc  1 (Executor:1) m.pml:30 (state 9)\t[plen[0] = (plen[0]+n)]
  5:\tproc  1 (Executor:1) m.pml:30 (state 12)\t[.(goto)]
      SIGKILL pid 3
  6:\tproc  0 (Killer:1) m.pml:40 (state 3)\t[kills = (kills+1)]
  6:\tproc  0 (Killer:1) m.pml:40 (state 4)\t[alive[1] = 0]
spin: trail ends after 6 steps
#processes: 3
\t\tplen[0] = 4
  6:\tproc  2 (Worker:1) m.pml:20 (state 5)
  6:\tproc  1 (Executor:1) m.pml:30 (state 9)
  6:\tproc  3 (Worker:1) m.pml:20 (state 5)
  6:\tproc  0 (Killer:1) m.pml:40 (state 3) <valid end state>
4 processes created
"""

MODEL = """\
/* a model */
proctype Worker() {
  d_step { x > 0 -> y = 1 }  /* @op worker: "input.recv()" reads */
  /* @op executor: "send_bytes(data)" writes */
  d_step { z -> w = 1 }
}
"""


def test_parse_pan_reads_counts_of_a_complete_search() -> None:
    result = model.parse_pan(PAN_CLEAN)
    assert (result.states, result.transitions, result.seconds, result.errors) == (2137593, 3858801, 4.17, 0)
    assert result.complete and not result.problems and result.error == ""


def test_parse_pan_names_the_first_error() -> None:
    deadlock = model.parse_pan(PAN_DEADLOCK)
    assert (deadlock.errors, deadlock.error) == (1, "invalid end state")
    assert model.error_kind(deadlock.error) == model.DEADLOCK
    assertion = model.parse_pan(PAN_ASSERT)
    assert assertion.error == "assertion violated (ranby[k]==0)"
    assert model.error_kind(assertion.error) == model.ASSERTION


def test_a_search_cut_short_by_memory_proves_nothing() -> None:
    result = model.parse_pan(PAN_OOM)
    assert not result.complete
    assert result.problems == [f"out of memory (the bound is {model.MEMORY_MB} MiB)"]
    check = model.CHECKS[0]
    assert model.judge(check, result, []) == (False, result.problems[0])


def test_parse_trail_splits_steps_from_the_final_state() -> None:
    steps, final = model.parse_trail(TRAIL)
    assert [(s.depth, s.pid, s.line) for s in steps] == [
        (1, 1, 10),
        (2, 1, 12),
        (3, 2, 20),
        (3, 2, 20),
        (4, 1, 30),
        (4, 1, 30),
        (4, 1, 31),
        (5, 1, 30),
        (6, 0, 40),
        (6, 0, 40),
    ]
    assert [(s.pid, s.line) for s in final] == [(2, 20), (1, 30), (3, 20), (0, 40)]
    assert model.killed_pids(TRAIL) == [3]


def test_op_map_takes_a_comment_alone_on_its_line_for_the_next_line(tmp_path: Path) -> None:
    path = tmp_path / "m.pml"
    path.write_text(MODEL)
    assert model.op_map([path]) == {
        ("m.pml", 3): 'worker: "input.recv()" reads',
        ("m.pml", 5): 'executor: "send_bytes(data)" writes',
    }


def test_render_trail_folds_repeats_and_lists_who_is_stuck() -> None:
    steps, final = model.parse_trail(TRAIL)
    ops = {
        ("m.pml", 20): "worker: recv() reads",
        ("m.pml", 30): "executor: activity_queue.put() writes",
        ("m.pml", 40): "SIGKILL",
    }
    waits = {("m.pml", 30): "executor: activity_queue.put(): the activity pipe is full"}
    # the two statements of the worker's one atomic step are one read; the executor's loop wrote twice;
    # the killed worker p3 and the killer are not waiting for anything
    assert model.render_trail(steps, final, ops, waits, killed=[3]) == [
        "worker p2: recv() reads",
        "executor: activity_queue.put() writes (x2)",
        "killer: SIGKILL worker p3",
        "  waits for ever: worker p2 in recv() reads",
        "  waits for ever: executor in activity_queue.put(): the activity pipe is full",
    ]
    # after an assertion nobody waits for ever: the trail says where each process was
    assert model.render_trail(steps, final, ops, waits, stuck=False, killed=[3])[-2:] == [
        "  then: worker p2 at recv() reads",
        "  then: executor at activity_queue.put() writes",
    ]


def _check(expect: str, where: str = "") -> model.Check:
    return model.Check("c", "0", "stage0.pml", {"K": 2}, expect, where)


def test_describe_names_what_an_assertion_means() -> None:
    assert model.describe("invalid end state") == model.DEADLOCK
    assert model.describe("assertion violated (ranby[k]==0)") == (
        "a workload given back or re-dispatched had already started"
    )
    assert model.describe("assertion violated ((outcome[1]!=0)&&(outcome[2]!=0))") == (
        "a dispatched workload never ends"
    )
    assert model.describe("assertion violated (x==1)") == "assertion violated (x==1)"


def test_judge_requires_the_final_stage_to_find_nothing() -> None:
    assert model.judge(_check(model.NONE), model.parse_pan(PAN_CLEAN), []) == (True, "none")
    ok, verdict = model.judge(_check(model.NONE), model.parse_pan(PAN_DEADLOCK), [])
    assert not ok and verdict == "deadlock"


def test_judge_requires_a_bite_at_the_named_place() -> None:
    trail = ["executor: put", "  waits for ever: executor in activity_queue.put() writes"]
    pan = model.parse_pan(PAN_DEADLOCK)
    assert model.judge(_check(model.DEADLOCK, "activity_queue.put"), pan, trail) == (
        True,
        "deadlock: activity_queue.put() writes",
    )
    # a deadlock elsewhere (say end()'s join) is not the one the check is about
    assert not model.judge(_check(model.DEADLOCK, 'end() "proc.join()"'), pan, trail)[0]
    # and finding nothing where a deadlock is known means the check no longer bites
    assert not model.judge(_check(model.DEADLOCK, "activity_queue.put"), model.parse_pan(PAN_CLEAN), [])[0]


def test_every_check_names_its_test_or_expects_nothing() -> None:
    for check in model.CHECKS:
        # a check that must find an error names the test it reproduces; one that must find nothing names
        # none, or the regression test of the race it found before that race was fixed
        assert check.expect == model.NONE or check.test, check.name
        assert check.gating or check.test == model.FINDING, check.name
        if check.test and check.test != model.FINDING:
            test_file = Path(model.__file__).parents[2] / model.TESTS / check.test.split("::")[0]
            assert test_file.is_file(), check.test


def test_the_sigterm_finding_is_a_gating_check_that_finds_nothing() -> None:
    (check,) = [c for c in model.CHECKS if c.name == "final/SIGTERM mid-dispatch"]
    assert check.gating and check.expect == model.NONE and check.stage == "final"
    test = "test_sigterm_at_any_line_of_a_dispatch_leaves_each_workload_in_exactly_one_place"
    assert check.test == f"test_exactly_once.py::{test}"
    assert "TERM_AFTER_WRITE" not in check.defines
    assert not [c.name for c in model.CHECKS if c.test == model.FINDING]


def test_select_by_stage() -> None:
    assert {c.stage for c in model.select(["final"])} == {"final"}
    assert model.select(None) == list(model.CHECKS)
    with pytest.raises(ToolError, match="unknown stage 7"):
        model.select(["7"])


def _tree(tmp_path: Path, content: bytes = b"print('overlay')\n") -> Layout:
    overlay = tmp_path / model.OVERLAY
    overlay.parent.mkdir(parents=True)
    overlay.write_bytes(content)
    (tmp_path / "model").mkdir()
    return Layout(root=tmp_path)


def test_hash_check_passes_after_rehash_and_fails_once_the_overlay_changes(tmp_path: Path) -> None:
    layout = _tree(tmp_path)
    assert model.overlay_hash_problems(layout) == [
        f"{model.HASH_FILE}: missing; review model/final.pml, then run `python -m tools model --rehash`"
    ]
    model.rehash(layout)
    assert model.overlay_hash_problems(layout) == []
    (tmp_path / model.OVERLAY).write_bytes(b"print('changed')\n")
    (problem,) = model.overlay_hash_problems(layout)
    assert problem.startswith(f"{model.OVERLAY} changed since model/final.pml was checked against it")
    assert "--rehash" in problem and "\n" not in problem


def test_hash_check_rejects_a_malformed_record(tmp_path: Path) -> None:
    layout = _tree(tmp_path)
    (tmp_path / model.HASH_FILE).write_text("not a hash\n")
    (problem,) = model.overlay_hash_problems(layout)
    assert problem.startswith(f"{model.HASH_FILE}: expected one line")


def test_the_recorded_hash_matches_the_overlay_in_this_tree() -> None:
    assert model.overlay_hash_problems() == []

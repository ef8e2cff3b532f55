"""``python -m tools port``: a patch's 3.3 API words rewritten into another line's, as a checkout.

The patches are written against the primary line (3.3). Where another line's API differs, a
patch's own lines need that line's words (3.3's ``workload.key`` is 3.1's ``_workload_key(workload)``
and 3.4's ``self.get_workload_key(workload)``), which is most of what a recorded resolution
(``patches/resolutions/<line>/<patch>``) says. ``port`` does that part::

    primary stage k-1 --RULES--> ported pre-image --.
    primary stage k   --RULES--> ported post-image -+-> ported patch (full blob ids)
    line's stage k-1  --git apply, strict, else --3way--> result, conflicts marked
                                        --RESIDUE--> ``# PORT:`` above each 3.3-only word left

The rules rewrite whole upstream files (the executor, task-sdk's supervisor), never the tests:
those run unchanged on every line. The ported patch applies to the line's stage k-1 strictly, or
else merges 3-way against the rewritten pre-image, so only what the line has in another shape is
a conflict. A line the port adds that still has a word of the 3.3 API the rules cannot rewrite
gets a ``# PORT: <why>`` comment above it. ``port --to L PATCH DIR`` commits the result in a
checkout of ``L`` (stages 0..k-1 as ``checkout`` makes them, the patch's author and message);
fixing the marked places is the review, then ``refresh --line L DIR`` records the resolution.
``refresh`` and ``lint-series`` refuse a resolution that still has a ``# PORT:`` or a conflict
marker. ``port --measure`` ports every patch that has a recorded resolution and counts the
resolution's hunks the port reproduces exactly.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.engine import apply as engine_mod
from tools.engine import checkout as checkout_mod
from tools.engine.apply import Engine, Tree
from tools.engine.series import PORT_MARK
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.gitcmd import TOOL_IDENT, GitError, git
from tools.shared.pins import Line

EXECUTOR = pins.EXECUTOR.repo_path
SUPERVISOR = pins.SUPERVISOR.repo_path
CODE_PATHS = frozenset(f.repo_path for f in pins.UPSTREAM_FILES)

# What a port leaves for the reviewer (tools.engine.series refuses both in a recorded resolution).
CONFLICT_RE = re.compile(r"^(<{7}|={7}|>{7})(?: |$)", re.M)

ANY, METHOD, FUNCTION = "any", "method", "function"


@dataclass(frozen=True)
class Rule:
    """One API difference: ``pattern`` (a regex) in the primary line's words becomes ``repl``.

    ``repl`` is a replacement string, or a function of the match where the other line's shape
    needs the matched lines re-indented. A pattern without a newline (``\\n``) is applied line by
    line, only to lines in ``scope``: ``method`` (inside a class), ``function`` (inside a
    module-level function) or ``any``; one with a newline is applied to the whole file (``re.M``)."""

    pattern: str
    repl: str | Callable[[re.Match[str]], str]
    why: str
    path: str = EXECUTOR
    scope: str = ANY


@dataclass(frozen=True)
class Residue:
    """A word of the primary line's API that has no rewrite on a line: a line the port adds that
    still matches ``pattern`` is marked ``# PORT: why`` for the reviewer."""

    pattern: str
    why: str
    path: str = EXECUTOR


RuleTable = Mapping[tuple[str, str], Sequence[Rule]]
ResidueTable = Mapping[tuple[str, str], Sequence[Residue]]

# -- the rules, per (from, to) line pair -------------------------------------------------------------
# Read off how each recorded resolution differs from its primary patch. A rule is an API difference
# between the lines, never one patch's wording; rules apply in order.

_NO_CONNECTION_TESTS = "3.1 and 3.2 have no connection-test workloads (no queued_connection_tests)"
# 3.3 looks a workload up in its three queued dicts.
_THREE_QUEUES = r"\(self\.queued_tasks, self\.queued_callbacks, self\.queued_connection_tests\)"
_OLD = "3.1/3.2: no ExecutorWorkload; the union is workloads.All of the module imported at the top"
# 3.3's _process_workloads pops a workload from whichever of the three queued dicts has it (the
# base's own code, the pre-image of the patches that change it).
_POP_FROM_THREE = (
    r"^( +)# A valid workload will exist in exactly one of these dicts\.\n"
    r" +# One pop will succeed, the others will return None gracefully\.\n"
    r" +(\w+) = \(\n"
    r" +self\.queued_tasks\.pop\((.+), None\)\n"
    r" +or self\.queued_callbacks\.pop\(\3, None\)\n"
    r" +or self\.queued_connection_tests\.pop\(\3, None\)\n"
    r" +\)\n"
    r" +if not \2:\n"
    r" +raise KeyError\(f\"Workload \{.+\} was not found in any queue\"\)\n"
)
# 3.3's worker as released: it reports the states the workload names, under the workload's key.
_BASE_RUN_BLOCK = (
    r"^(?P<gap>\n?)(?P<i> +)if workload\.running_state is not None:\n"
    r"(?P=i)    output\.put\(\(workload\.key, workload\.running_state, None\)\)\n"
    r"\n"
    r"(?P=i)try:\n"
    r"(?P=i)    BaseExecutor\.run_workload\(\n(?:(?P=i)        .*\n)+(?P=i)    \)\n"
    r"(?P=i)    output\.put\(\(workload\.key, workload\.success_state, None\)\)\n"
    r"(?P=i)except Exception as e:\n"
    r"(?P=i)    log\.exception\(\"Workload execution failed\.\", workload_type=type\(workload\)\.__name__\)\n"
    r"(?P=i)    output\.put\(\(workload\.key, workload\.failure_state, e\)\)\n"
)
_BASE_RUN_32 = (
    "\\g<gap>\\g<i># Handle different workload types\n"
    "\\g<i>if isinstance(workload, workloads.ExecuteTask):\n"
    "\\g<i>    try:\n"
    "\\g<i>        _execute_work(log, workload, team_conf)\n"
    "\\g<i>        output.put((workload.ti.key, TaskInstanceState.SUCCESS, None))\n"
    "\\g<i>    except Exception as e:\n"
    '\\g<i>        log.exception("Task execution failed.")\n'
    "\\g<i>        output.put((workload.ti.key, TaskInstanceState.FAILED, e))\n"
    "\n"
    "\\g<i>elif isinstance(workload, workloads.ExecuteCallback):\n"
    "\\g<i>    output.put((workload.callback.id, CallbackState.RUNNING, None))\n"
    "\\g<i>    try:\n"
    "\\g<i>        _execute_callback(log, workload, team_conf)\n"
    "\\g<i>        output.put((workload.callback.id, CallbackState.SUCCESS, None))\n"
    "\\g<i>    except Exception as e:\n"
    '\\g<i>        log.exception("Callback execution failed")\n'
    "\\g<i>        output.put((workload.callback.id, CallbackState.FAILED, e))\n"
    "\n"
    "\\g<i>else:\n"
    '\\g<i>    raise ValueError(f"LocalExecutor does not know how to handle {type(workload)}")\n'
)
_BASE_RUN_31 = (
    "\\g<i>key = None\n"
    '\\g<i>if ti := getattr(workload, "ti", None):\n'
    "\\g<i>    key = ti.key\n"
    "\\g<i>else:\n"
    '\\g<i>    raise TypeError(f"Don\'t know how to get ti key from {type(workload).__name__}")\n'
    "\n"
    "\\g<i>try:\n"
    "\\g<i>    _execute_work(log, workload)\n"
    "\n"
    "\\g<i>    output.put((key, TaskInstanceState.SUCCESS, None))\n"
    "\\g<i>except Exception as e:\n"
    '\\g<i>    log.exception("uhoh")\n'
    "\\g<i>    output.put((key, TaskInstanceState.FAILED, e))\n"
)


# 3.3 runs any workload with BaseExecutor.run_workload() and reports the states the workload names;
# 3.1/3.2 run a task with _execute_work(log, workload[, team_conf]) and report TaskInstanceState (3.2
# also a callback with _execute_callback() and CallbackState, in a branch of its own). The patches
# change the report calls (4-tuples with the pid, then _send_result) and add a line after the first
# and before the others: those are kept, the rest is the line's own shape.
_RUN_BLOCK = (
    r"^(?P<i> +)key = workload\.key\n"
    r"(?P=i)(?P<start>.*)\bworkload\.running_state\b(?P<start_end>.*)\n"
    r"(?:(?P=i)(?P<after_start>\S.*)\n)?"
    r"(?P<gap>\n?)"
    r"(?P=i)try:\n"
    r"(?P=i)    BaseExecutor\.run_workload\(\n(?:(?P=i)        .*\n)+(?P=i)    \)\n"
    r"(?:(?P=i)    (?P<before_ok>(?!.*success_state)\S.*)\n)?"
    r"(?P=i)    (?P<ok>.*)\bworkload\.success_state\b(?P<ok_end>.*)\n"
    r"(?P=i)except Exception as e:\n"
    r"(?P=i)    log\.exception\(\"Workload execution failed\.\", workload_type=type\(workload\)\.__name__\)\n"
    r"(?:(?P=i)    (?P<before_fail>(?!.*failure_state)\S.*)\n)?"
    r"(?P=i)    (?P<fail>.*)\bworkload\.failure_state\b(?P<fail_end>.*)\n"
)


def _branch(m: re.Match[str], indent: str, states: tuple[str, str, str], run: str, fail_log: str) -> str:
    """One branch of a 3.1/3.2 worker: the report calls of ``m`` with the line's ``states``."""
    g = m.groupdict()
    running, success, failure = states
    out = [f"{indent}{g['start']}{running}{g['start_end']}\n"]
    if g["after_start"]:
        out.append(f"{indent}{g['after_start']}\n")
    out.append(f"{indent}try:\n{indent}    {run}\n")
    if g["before_ok"]:
        out.append(f"{indent}    {g['before_ok']}\n")
    out.append(f"{indent}    {g['ok']}{success}{g['ok_end']}\n")
    out.append(f"{indent}except Exception as e:\n{indent}    {fail_log}\n")
    if g["before_fail"]:
        out.append(f"{indent}    {g['before_fail']}\n")
    out.append(f"{indent}    {g['fail']}{failure}{g['fail_end']}\n")
    return "".join(out)


def _run_block_32(m: re.Match[str]) -> str:
    i = m["i"]
    task = _branch(
        m,
        i + "    ",
        ("None", "TaskInstanceState.SUCCESS", "TaskInstanceState.FAILED"),
        "_execute_work(log, workload, team_conf)",
        'log.exception("Task execution failed.")',
    )
    callback = _branch(
        m,
        i + "    ",
        ("CallbackState.RUNNING", "CallbackState.SUCCESS", "CallbackState.FAILED"),
        "_execute_callback(log, workload, team_conf)",
        'log.exception("Callback execution failed")',
    )
    return (
        f"{i}key = workload.key\n{i}# Handle different workload types\n"
        f"{i}if isinstance(workload, workloads.ExecuteTask):\n"
        f"{i}    # 3.2 reports no running state for a task: say which worker took it.\n{task}\n"
        f"{i}elif isinstance(workload, workloads.ExecuteCallback):\n{callback}\n"
        f"{i}else:\n"
        f'{i}    raise ValueError(f"LocalExecutor does not know how to handle {{type(workload)}}")\n'
    )


def _run_block_31(m: re.Match[str]) -> str:
    i = m["i"]
    block = _branch(
        m,
        i,
        ("None", "TaskInstanceState.SUCCESS", "TaskInstanceState.FAILED"),
        "_execute_work(log, workload)\n",
        'log.exception("uhoh")',
    )
    head, _, rest = block.partition(f"{i}try:\n")
    return (
        f'{i}key = None\n{i}if ti := getattr(workload, "ti", None):\n{i}    key = ti.key\n{i}else:\n'
        f'{i}    raise TypeError(f"Don\'t know how to get ti key from {{type(workload).__name__}}")\n'
        f"{i}# Say which worker took it: 3.1 reports no running state for a task.\n"
        f"{head}{m['gap']}{i}try:\n{rest}"
    )


# The line length ruff format keeps to (pyproject.toml), in Airflow as here.
LINE_LENGTH = 110


def _join_if_fits(m: re.Match[str]) -> str:
    """A call split over three lines, on one when it fits (what ruff format makes of a shorter word)."""
    joined = f"{m['head']}{m['args']}{m['close']}"
    return joined if len(joined) <= LINE_LENGTH and not m["args"].endswith(",") else m[0]


_OLD_WORKLOADS = (
    # 3.3's workload union is ExecutorWorkload; 3.1/3.2 import the workloads module and call it All.
    Rule(r"^\s*from airflow\.executors\.workloads import ExecutorWorkload\n", "", _OLD),
    Rule(r"\bExecutorWorkload\b", "workloads.All", _OLD),
    # 3.3's workloads carry their key; on 3.1/3.2 the series' _workload_key() (patch 2) finds it.
    Rule(
        r"(?<![\w.])(workload|w)\.key\b",
        r"_workload_key(\1)",
        "3.1/3.2 workloads have no .key: _workload_key(workload) (a task's ti.key, a callback's id)",
    ),
    # 3.3's workloads.types.state_class_for_key(key).FAILED is the series' _failed_state(key).
    Rule(
        r"^from airflow\.executors\.workloads\.types import state_class_for_key\n",
        "",
        "3.1/3.2 have no workloads.types.state_class_for_key",
    ),
    Rule(
        r"\bstate_class_for_key\((\w+)\)\.FAILED\b",
        r"_failed_state(\1)",
        "3.1/3.2: a key's failed state is _failed_state(key) (patch 2), not state_class_for_key(key)",
    ),
    # ... which is shorter: a call ruff format split for the longer word is on one line there.
    Rule(
        r"^(?P<head> +\S.*\()\n +(?P<args>.*\b_failed_state\(.*)\n +(?P<close>\).*)$",
        _join_if_fits,
        "3.1/3.2: _failed_state(key) is shorter, so the call fits on one line",
    ),
    # The supervisor's psutil.Process has no TimeoutExpired attribute before task-sdk 1.3.
    Rule(
        r"\bself\._process\.TimeoutExpired\b",
        "psutil.TimeoutExpired",
        "task-sdk 1.1/1.2: the exception is psutil.TimeoutExpired, not an attribute of the process",
        path=SUPERVISOR,
    ),
    # No BaseExecutor.fail_connection_test to extend.
    Rule(
        r"\n    def fail_connection_test\(self, key\) -> None:\n(?:        .*\n)+", "", _NO_CONNECTION_TESTS
    ),
)

RULES: dict[tuple[str, str], tuple[Rule, ...]] = {
    ("3.3", "3.4"): (
        # 3.3's three queued dicts are 3.4's executor_queues, one per workload type.
        Rule(
            r"^( +)# A valid workload will exist in exactly one of these dicts\.\n"
            r" +for (\w+) in " + _THREE_QUEUES + r":\n"
            r" +if \2\.pop\((.+), None\) is not None:\n"
            r" +return \2\n"
            r" +raise KeyError\(f\"Workload \{.+\} was not found in any queue\"\)\n",
            "\\1key = \\3\n\\1\\2 = self.executor_queues[workload.type]\n"
            "\\1if \\2.pop(key, None) is None:\n"
            '\\1    raise KeyError(f"Workload {key} was not found in any queue")\n'
            "\\1return \\2\n",
            "3.4: a workload waits in executor_queues[workload.type], not in one of three queued dicts",
        ),
        # 3.3 pops a workload from whichever of its three queued dicts has it (the base's own code).
        Rule(
            _POP_FROM_THREE,
            "\\1\\2 = self.executor_queues[workload.type].pop(key, None)\n"
            "\\1if not \\2:\n"
            '\\1    raise KeyError(f"Workload {key} was not found in any queue")\n',
            "3.4: a workload waits in executor_queues[workload.type], not in one of three queued dicts",
        ),
        # 3.4's workloads are keyed through the executor: get_workload_key(), a staticmethod-like
        # classmethod, so a module-level function (the worker) calls it on the class.
        Rule(
            r"(?<![\w.])(workload|w)\.key\b",
            r"self.get_workload_key(\1)",
            "3.4: a workload's key is self.get_workload_key(workload)",
            scope=METHOD,
        ),
        Rule(
            r"(?<![\w.])(workload|w)\.key\b",
            r"LocalExecutor.get_workload_key(\1)",
            "3.4: a workload's key is LocalExecutor.get_workload_key(workload)",
            scope=FUNCTION,
        ),
        Rule(
            r"(?<![\w.])ti\.key\b",
            "self.get_task_key(ti)",
            "3.4: a task instance's key is self.get_task_key(ti)",
            scope=METHOD,
        ),
        Rule(
            r"\bself\.queued_tasks\b",
            "self.executor_queues[WorkloadType.EXECUTE_TASK]",
            "3.4: queued tasks are executor_queues[WorkloadType.EXECUTE_TASK]",
        ),
        Rule(
            r"\bself\.queued_callbacks\b",
            "self.executor_queues[WorkloadType.EXECUTE_CALLBACK]",
            "3.4: queued callbacks are executor_queues[WorkloadType.EXECUTE_CALLBACK]",
        ),
        Rule(
            r"\bself\.queued_connection_tests\b",
            "self.executor_queues[WorkloadType.TEST_CONNECTION]",
            "3.4: queued connection tests are executor_queues[WorkloadType.TEST_CONNECTION]",
        ),
        # BaseExecutor's hook that moves queued workloads to execute_async.
        Rule(r"\btrigger_tasks\b", "trigger_workloads", "3.4 renamed BaseExecutor.trigger_tasks"),
    ),
    ("3.3", "3.2"): (
        Rule(
            _BASE_RUN_BLOCK,
            _BASE_RUN_32,
            "3.2 runs a task with _execute_work(), a callback with _execute_callback()",
        ),
        Rule(
            _POP_FROM_THREE,
            "\\1# Remove from appropriate queue based on workload type\n"
            "\\1if isinstance(workload, workloads.ExecuteTask):\n"
            "\\1    del self.queued_tasks[workload.ti.key]\n"
            "\\1elif isinstance(workload, workloads.ExecuteCallback):\n"
            "\\1    del self.queued_callbacks[workload.callback.id]\n",
            "3.2 removes a workload from the queued dict of its type",
        ),
        Rule(
            _RUN_BLOCK,
            _run_block_32,
            "3.2 runs a task with _execute_work(), a callback with _execute_callback()",
        ),
        *_OLD_WORKLOADS,
        Rule(
            r"^( +)for (\w+) in " + _THREE_QUEUES + ":$",
            "\\1queues: tuple[dict, ...] = (self.queued_tasks, self.queued_callbacks)\n\\1for \\2 in queues:",
            _NO_CONNECTION_TESTS + " (and mypy wants the tuple's type)",
        ),
        # 3.2's BaseExecutor.change_state is annotated with TaskInstanceKey; callbacks' keys pass too.
        Rule(
            r"^( +)(self\.change_state\(key, state, .*remove_running=.*\))$",
            "\\1# 3.2's change_state is annotated for task keys only; it takes callback keys too.\n"
            "\\1\\2  # type: ignore[arg-type]",
            "3.2: change_state() is annotated for task keys only",
        ),
        Rule(
            r"^( +)(super\(\)\.change_state\(key, .*\))$",
            "\\1\\2  # type: ignore[arg-type]",
            "3.2: change_state() is annotated for task keys only",
        ),
    ),
    ("3.3", "3.1"): (
        Rule(
            _BASE_RUN_BLOCK, _BASE_RUN_31, "3.1 runs a task with _execute_work(log, workload), nothing else"
        ),
        Rule(_POP_FROM_THREE, "\\1del self.queued_tasks[workload.ti.key]\n", "3.1 queues tasks only"),
        Rule(_RUN_BLOCK, _run_block_31, "3.1 runs a task with _execute_work(log, workload), nothing else"),
        *_OLD_WORKLOADS,
        # 3.1 has no workloads.types: a key is a TaskInstanceKey, a state a TaskInstanceState.
        Rule(
            r"^( +)from airflow\.executors\.workloads\.types import WorkloadKey, WorkloadState$",
            "\\1from airflow.models.taskinstancekey import TaskInstanceKey as WorkloadKey\n"
            "\\1from airflow.utils.state import TaskInstanceState as WorkloadState",
            "3.1 has no workloads.types: its keys are TaskInstanceKey, its states TaskInstanceState",
        ),
        # 3.1's result tuples are TaskInstanceStateType, defined in the module, not workloads.types'.
        Rule(
            r"^( +)from airflow\.executors\.workloads\.types import WorkloadResultType$",
            "\\1TaskInstanceStateType = tuple[workloads.TaskInstance, TaskInstanceState, Exception | None]",
            "3.1 has no workloads.types.WorkloadResultType: its result tuple is TaskInstanceStateType",
        ),
        Rule(
            r"\bWorkloadResultType\b",
            "TaskInstanceStateType",
            "3.1 calls the result tuple TaskInstanceStateType",
        ),
        # 3.1 has no multi-team executor config: no team_conf for the worker, a fixed process title.
        Rule(r"^ +team_conf,\n", "", "3.1's worker takes no team_conf"),
        Rule(r'^ +"team_conf": self\.conf,\n', "", "3.1's worker takes no team_conf"),
        Rule(
            r'\bf"\{_get_executor_process_title_prefix\(team_conf\.team_name\)\} ([^{"]*)"',
            r'"airflow worker -- LocalExecutor: \1"',
            "3.1's worker process title has no team prefix (and then nothing to format)",
        ),
        Rule(
            r"\{_get_executor_process_title_prefix\(team_conf\.team_name\)\} ",
            "airflow worker -- LocalExecutor: ",
            "3.1's worker process title has no team prefix",
        ),
        # 3.1 runs tasks only, whose workload has no state attributes.
        Rule(r"\bworkload\.running_state\b", "None", "3.1 reports no running state for a task"),
        Rule(r"\bworkload\.success_state\b", "TaskInstanceState.SUCCESS", "3.1: a task succeeds as SUCCESS"),
        Rule(r"\bworkload\.failure_state\b", "TaskInstanceState.FAILED", "3.1: a task fails as FAILED"),
        # 3.1's _process_workloads(self, workloads) names its argument after the module 3.2 imports.
        Rule(r"\bworkload_list\b", "workloads", "3.1: _process_workloads' argument is `workloads`"),
        Rule(
            r"^( +)for (\w+) in " + _THREE_QUEUES + ":$",
            "\\1queues: tuple[dict, ...] = (self.queued_tasks,)\n\\1for \\2 in queues:",
            "3.1 queues tasks only (and mypy wants the tuple's type)",
        ),
    ),
}

_OLD_RESIDUE = (
    Residue(
        r"\b(?:BaseExecutor\.)?run_workload\(",
        "3.1/3.2 run a task with _execute_work(log, workload[, team_conf]), not run_workload",
    ),
    Residue(r"connection_test|TEST_CONNECTION", _NO_CONNECTION_TESTS),
    Residue(r"\bstate_class_for_key\b", "3.1/3.2 have no state_class_for_key"),
    Residue(r"\bExecutorWorkload\b|\.key\b(?<!ti\.key)(?<!\)\.key)", "a 3.3 workload word the rules left"),
)

RESIDUE: dict[tuple[str, str], tuple[Residue, ...]] = {
    ("3.3", "3.4"): (
        Residue(
            r"\bqueued_(?:tasks|callbacks|connection_tests)\b",
            "3.4 keeps queued workloads in executor_queues[WorkloadType...]",
        ),
        Residue(r"(?<![\w.])(?:workload|w|ti)\.key\b", "3.4 keys through get_workload_key()/get_task_key()"),
        Residue(r"\btrigger_tasks\b", "3.4 calls it trigger_workloads"),
    ),
    ("3.3", "3.2"): (
        *_OLD_RESIDUE,
        Residue(
            r"\.(?:running|success|failure)_state\b",
            "3.2's workloads have no state attributes: a task reports TaskInstanceState, a callback "
            "CallbackState, each in its own branch of the worker",
        ),
    ),
    ("3.3", "3.1"): (
        *_OLD_RESIDUE,
        Residue(r"\.(?:running|success|failure)_state\b", "3.1's workloads have no state attributes"),
        Residue(r"queued_callbacks|ExecuteCallback|CallbackState", "3.1 runs no callbacks"),
        Residue(r"\bworkloads\.types\b", "3.1 has no workloads.types (keys are TaskInstanceKey)"),
    ),
}


# -- rewriting ----------------------------------------------------------------------------------------


def _scopes(lines: list[str]) -> list[str]:
    """Per line: ``method`` inside a class, ``function`` inside a module-level def, else ``any``."""
    out, current = [], ANY
    for ln in lines:
        if ln[:1] not in ("", " ", "\t", "\n", "#", ")", "]"):
            current = (
                METHOD
                if ln.startswith("class ")
                else FUNCTION
                if ln.startswith(("def ", "async def "))
                else ANY
            )
        out.append(current)
    return out


def rewrite(text: str, rules: Iterable[Rule], path: str) -> str:
    """``text`` (the file at ``path``) with every rule for that path applied, in order."""
    for rule in rules:
        if rule.path != path:
            continue
        if "\\n" in rule.pattern or "\n" in rule.pattern:
            text = re.sub(rule.pattern, rule.repl, text, flags=re.M)
            continue
        pattern = re.compile(rule.pattern)
        lines = text.splitlines(keepends=True)
        scopes = _scopes(lines)
        text = "".join(
            pattern.sub(rule.repl, ln) if rule.scope in (ANY, s) else ln
            for ln, s in zip(lines, scopes, strict=True)
        )
    return text


# -- porting one patch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    path: str
    line: int  # 1-based, in the result
    what: str  # "conflict" or "PORT: <why>"


@dataclass
class Ported:
    name: str
    line: Line
    k: int  # the patch's position: the result is stage k of the line
    how: str  # "clean", "3-way" or "conflicts"
    files: dict[str, bytes | None]  # every file the patch touches, as the port leaves it
    patch: str  # the ported patch (the rewritten pre-image -> post-image), full blob ids
    marks: list[Mark] = field(default_factory=list)


def _g(repo: Path, *args: str, input: bytes | None = None, check: bool = True) -> str:
    return git(*args, cwd=repo, isolated=True, input=input, check=check, env=TOOL_IDENT)


def _write(repo: Path, files: dict[str, bytes | None]) -> None:
    for rel, data in files.items():
        path = repo / rel
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _diff(repo: Path, *args: str) -> str:
    # The diff format-patch writes (default algorithm and context), so hunks compare.
    return _g(repo, "diff", "--full-index", "--no-color", "--no-renames", *args)


class Porter:
    """Ports patches of the engine's series from the primary line to ``to``."""

    def __init__(
        self,
        engine: Engine,
        to: Line | str,
        source: Line | str | None = None,
        rules: RuleTable | None = None,
        residue: ResidueTable | None = None,
    ):
        self.engine = engine
        self.source = engine.line(source or engine.primary)
        if self.source != engine.primary:
            raise ToolError(
                f"the patches are written against the primary line {engine.primary.name}; "
                f"port from it, not from {self.source.name}"
            )
        self.to = engine.line(to)
        if self.to == self.source:
            raise ToolError(f"--to {self.to.name} is the line the patches are written for: nothing to port")
        pair = (self.source.name, self.to.name)
        self.rules: Sequence[Rule] = (RULES if rules is None else rules).get(pair, ())
        self.residue: Sequence[Residue] = (RESIDUE if residue is None else residue).get(pair, ())

    def name_of(self, patch: str) -> str:
        """The series file name for ``patch``: its name, its path, or its number (``7``, ``0007``)."""
        names = self.engine.series.names
        base = Path(patch).name
        if base in names:
            return base
        if patch.isdigit() and 1 <= int(patch) <= len(names):
            return names[int(patch) - 1]
        found = [n for n in names if n.startswith(base)]
        if len(found) == 1:
            return found[0]
        raise ToolError(
            f"{patch!r} is not a patch of patches/series (a name, a path or a number 1-{len(names)})"
        )

    def _rewrite_tree(self, tree: Tree, paths: Iterable[str]) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for p in paths:
            data = tree.get(p)
            if data is not None and p in CODE_PATHS:
                data = rewrite(data.decode("utf-8", "surrogateescape"), self.rules, p).encode(
                    "utf-8", "surrogateescape"
                )
            out[p] = data
        return out

    def port(self, patch: str) -> Ported:
        name = self.name_of(patch)
        k = self.engine.series.index(name)
        spec = self.engine.series.patches.get(name)
        if spec is None:
            raise ToolError(f"patches/{name} does not exist")
        primary = self.engine.apply_line(self.source)
        target = self.engine.apply_line(self.to)
        if k >= len(primary.stages):
            raise ToolError(f"{name} does not apply to {self.source.name} itself: fix that first")
        if k - 1 > target.final:
            failed = target.patches[target.final]
            raise ToolError(f"{self.to.name} stops before {name}: {failed.detail}")
        paths = spec.touched
        pre = self._rewrite_tree(primary.stage(k - 1), paths)
        post = self._rewrite_tree(primary.stage(k), paths)
        parent = target.stage(k - 1)
        with tempfile.TemporaryDirectory(prefix="lepatch-port-") as tmp:
            repo = Path(tmp)
            _g(repo, "init", "-q")
            # The ported patch: a diff between the rewritten pre- and post-images.
            _write(repo, pre)
            _g(repo, "add", "-A")
            _g(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", "ported pre-image")
            _write(repo, post)
            _g(repo, "add", "-A")
            ported = _diff(repo, "--cached", "HEAD")
            # Apply it to the line's stage k-1: strict, else 3-way against the rewritten pre-image
            # (its blobs are in the object store already).
            _g(repo, "read-tree", "--empty")
            _g(repo, "clean", "-q", "-fdx")
            _write(repo, {p: d for p, d in parent.items()})
            _g(repo, "add", "-A")
            _g(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", f"{self.to.name} stage {k - 1}")
            patch_file = repo / ".git" / "ported.patch"
            patch_file.write_text(ported, encoding="utf-8", errors="surrogateescape")
            how = "clean"
            try:
                _g(repo, "apply", "--index", str(patch_file))
            except GitError:
                how = "3-way"
                try:
                    _g(repo, "apply", "--3way", str(patch_file))
                except GitError as exc:
                    if "with conflicts" not in exc.stderr:
                        raise ToolError(
                            f"{name} ported to {self.to.name} applies neither strictly nor 3-way: "
                            + engine_mod.describe_apply_error(spec, exc.stderr)
                        ) from None
                    how = "conflicts"
            files: dict[str, bytes | None] = {}
            for p in paths:
                files[p] = (repo / p).read_bytes() if (repo / p).is_file() else None
        result = Ported(name, self.to, k, how, files, ported)
        self._mark(result, parent)
        return result

    def _mark(self, result: Ported, parent: Tree) -> None:
        """Mark conflicts, and put ``# PORT: why`` above each added line with a 3.3-only word."""
        for path, data in result.files.items():
            if data is None:
                continue
            residue = [r for r in self.residue if r.path == path]
            old = Counter(parent.get(path, b"").decode("utf-8", "surrogateescape").splitlines(keepends=True))
            out: list[str] = []
            for ln in data.decode("utf-8", "surrogateescape").splitlines(keepends=True):
                why = None
                if old[ln] > 0:
                    old[ln] -= 1  # a line the line's stage already had: not the port's to mark
                elif not ln.lstrip().startswith("#"):
                    why = next((r.why for r in residue if re.search(r.pattern, ln)), None)
                if why is not None:
                    indent = ln[: len(ln) - len(ln.lstrip())]
                    out.append(f"{indent}{PORT_MARK} {why}\n")
                    result.marks.append(Mark(path, len(out), f"PORT: {why}"))
                out.append(ln)
                if ln.startswith("<<<<<<<") and CONFLICT_RE.match(ln):
                    result.marks.append(Mark(path, len(out), "conflict"))
            result.files[path] = "".join(out).encode("utf-8", "surrogateescape")


def port_into(engine: Engine, porter: Porter, patch: str, dest: Path) -> Ported:
    """A checkout of the target line in ``dest`` with stages 0..k-1 and the ported patch committed
    (conflicts and marks included: the review fixes them, ``commit --amend`` keeps the author)."""
    result = porter.port(patch)
    checkout_mod.checkout(engine, porter.to, dest, upto=result.k - 1)
    tree = dict(checkout_mod._tree_of(dest, "HEAD"))
    for p, data in result.files.items():
        if data is None:
            tree.pop(p, None)
        else:
            tree[p] = data
    checkout_mod._commit_from_mail(dest, engine.layout.patches / result.name, tree)
    saved = Path(_g(dest, "rev-parse", "--absolute-git-dir").strip()) / "lepatch-port" / result.name
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(result.patch, encoding="utf-8", errors="surrogateescape")
    return result


# -- measuring against the recorded resolutions -------------------------------------------------------

_HUNK_HEAD = re.compile(r"^@@ -(\d+(?:,\d+)?) \+\d+((?:,\d+)?) @@(.*)$")


def hunks(diff: str) -> dict[str, list[str]]:
    """Per file, its hunks as text; the new-side start is dropped (an earlier hunk moves it)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    path = ""
    for ln in diff.splitlines():
        m = re.match(r"^diff --git a/(\S+) b/", ln)
        if m:
            path, current = m.group(1), None
            out.setdefault(path, [])
            continue
        h = _HUNK_HEAD.match(ln)
        if h:
            out[path].append(f"@@ -{h.group(1)} +{h.group(2)} @@{h.group(3)}\n")
            current = out[path]
            continue
        if current is not None and ln[:1] in (" ", "+", "-", "\\"):
            current[-1] += ln + "\n"
        elif current is not None and ln == "":
            current[-1] += "\n"
        else:
            current = None
    return out


@dataclass
class Measure:
    line: str
    name: str
    hunks: int
    reproduced: int
    how: str
    marks: int

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "patch": self.name,
            "hunks": self.hunks,
            "reproduced": self.reproduced,
            "how": self.how,
            "marks": self.marks,
        }


def measure(
    engine: Engine,
    lines: Iterable[str] | None = None,
    rules: RuleTable | None = None,
    residue: ResidueTable | None = None,
) -> list[Measure]:
    """For every recorded resolution: how many of its hunks porting the primary patch reproduces.

    A hunk counts when the port's diff against the line's stage k-1 has it byte for byte: its old
    range, its new length, its function context and every line; only its new start is not compared
    (it moves with the length of the hunks before it)."""
    wanted = {engine.line(x).name for x in lines} if lines else None
    out: list[Measure] = []
    porters: dict[str, Porter] = {}
    for (line_name, name), res in sorted(engine.series.resolutions.items()):
        if (wanted and line_name not in wanted) or name not in engine.series.patches:
            continue
        if line_name not in porters:
            porters[line_name] = Porter(engine, line_name, rules=rules, residue=residue)
        porter = porters[line_name]
        recorded = hunks(res.diff or res.text)
        result = porter.port(name)
        parent = engine.apply_line(porter.to).stage(result.k - 1)
        with tempfile.TemporaryDirectory(prefix="lepatch-measure-") as tmp:
            repo = Path(tmp)
            _g(repo, "init", "-q")
            _write(repo, {p: parent.get(p) for p in recorded})
            _g(repo, "add", "-A")
            _g(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", "parent")
            _write(repo, {p: result.files.get(p, parent.get(p)) for p in recorded})
            _g(repo, "add", "-A")
            mine = hunks(_diff(repo, "--cached", "HEAD"))
        total = sum(len(h) for h in recorded.values())
        hit = 0
        for path, theirs in recorded.items():
            have = Counter(mine.get(path, []))
            for h in theirs:
                if have[h] > 0:
                    have[h] -= 1
                    hit += 1
        out.append(Measure(line_name, name, total, hit, result.how, len(result.marks)))
    return out


def totals(rows: Iterable[Measure]) -> dict[str, tuple[int, int]]:
    """Per line, and ``overall``: (hunks reproduced exactly, hunks recorded)."""
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        for key in (r.line, "overall"):
            hit, total = out.get(key, (0, 0))
            out[key] = (hit + r.reproduced, total + r.hunks)
    return out


def render_measure(rows: list[Measure]) -> str:
    width = max([len("patch"), *(len(r.name) for r in rows)])
    out = [f"{'line':<5} {'patch':<{width}} {'hunks':>9}  port"]
    for r in rows:
        out.append(
            f"{r.line:<5} {r.name:<{width}} {r.reproduced:>3} of {r.hunks:<3}  {r.how}, {r.marks} mark(s)"
        )
    for key, (hit, total) in sorted(totals(rows).items(), key=lambda kv: kv[0] == "overall"):
        out.append(f"{key}: {hit} of {total} hunks reproduced exactly")
    return "\n".join(out)


# -- CLI ---------------------------------------------------------------------------------------------


def _cmd_port(args: argparse.Namespace) -> int:
    engine = engine_mod.default_engine()
    if args.measure:
        rows = measure(engine, args.to and [args.to])
        print(render_measure(rows))
        if args.json:
            args.json.write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")
        return 0
    if not args.to or not args.patch or not args.dir:
        raise ToolError("usage: python -m tools port [--from 3.3] --to LINE PATCH DIR (or --measure)")
    porter = Porter(engine, args.to, args.source)
    result = port_into(engine, porter, args.patch, args.dir)
    where = shlex.quote(str(args.dir))
    print(
        f"{args.dir}: {porter.to.label} stages 0..{result.k - 1} + {result.name} ported from "
        f"{porter.source.name} ({result.how}; {len(porter.rules)} rule(s) for {porter.source.name} -> "
        f"{porter.to.name})"
    )
    for m in result.marks:
        print(f"{args.dir / m.path}:{m.line}: {m.what}")
    if result.marks:
        print(
            f"  {len(result.marks)} place(s) to review: fix each, delete the {PORT_MARK} lines and conflict "
            f"markers, then `git -C {where} commit -a --amend --no-edit`"
        )
    else:
        print(f"  nothing marked: review the commit (`git -C {where} show`) all the same")
    print(f"  then record it: python -m tools refresh --line {porter.to.name} {where}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "port", help="rewrite a patch's 3.3 API words for another line into a checkout, marks for review"
    )
    p.add_argument("--from", dest="source", default=None, help="the line the patch is written for (3.3)")
    p.add_argument("--to", help="the line to port to (3.4, 3.2, 3.1)")
    p.add_argument(
        "--measure",
        action="store_true",
        help="port every patch with a recorded resolution; count its hunks reproduced exactly",
    )
    p.add_argument("--json", type=Path, help="with --measure: also write the figures as JSON")
    p.add_argument("patch", nargs="?", help="patch: file name, path or number in patches/series")
    p.add_argument("dir", nargs="?", type=Path, help="the checkout to make (must not exist or be empty)")
    p.set_defaults(func=_cmd_port)

"""Internals a PR removes, and the upstream tests that still use them.

Upstream's executor tests read internals the series removes (``result_queue``,
``_unread_messages``, ``activity_queue``, an unstarted executor with mocked queues passed to
``_check_workers()``). A PR that removes them breaks those tests on its first CI run unless it
says so. This module:

1. derives, with ``ast``, from the executor before and after the PR which module-level names
   and ``LocalExecutor`` attributes and methods it removes (``renamed`` when a removed function
   has the body of an added one) and which methods listed in ``CHANGED_SEMANTICS`` it changes;
2. scans a clone's tests (``airflow-core/tests/**/*.py``) for uses of those names: attribute
   access, names imported from the executor module, and strings naming them (``mock.patch``
   targets, ``mock.patch.object`` and ``getattr`` arguments);
3. pairs every hit with the test of ours that checks the same behaviour (``EQUIVALENTS``,
   checked against the PR's own test files: a test that is not there is not claimed), or says
   there is none.

Names are matched by name, not by type: ``executor.workers`` and ``other.workers`` are the same
hit. That over-reports rather than misses, which is the right side for a review checklist.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tools.delivery import upstream_tests

EXECUTOR_CLASS = "LocalExecutor"
EXECUTOR_MODULE = "airflow.executors.local_executor"
TESTS_ROOT = "airflow-core/tests/"

# What our tests check in place of an upstream test that reads a removed internal: removed name ->
# our tests ("file.py::test" under airflow-core/tests/unit/executors/local_executor/) that
# check the same behaviour through the executor's public surface. Only tests present in the
# PR's tree are claimed.
EQUIVALENTS: dict[str, tuple[str, ...]] = {
    # results reach the scheduler (and a dead worker's key is failed) without a shared queue
    "result_queue": (
        "test_worker_death.py::test_results_keep_flowing_after_worker_killed_while_writing_a_large_result",
        "test_slots.py::test_dispatched_workloads_hold_slots_until_their_result",
    ),
    # a workload reaches an idle worker; none waits behind a busy one
    "activity_queue": (
        "test_dispatch.py::test_dispatch_reuses_an_idle_worker",
        "test_dispatch.py::test_dispatch_keeps_the_workload_when_every_worker_is_busy",
    ),
    # an idle executor spawns nothing; never more live workers than parallelism
    "_unread_messages": (
        "test_dispatch.py::test_dispatch_starts_a_worker_under_parallelism",
        "test_dispatch.py::test_spawn_start_method_starts_workers_lazily",
    ),
    # a worker that dies mid-task is removed, its key failed, and later work runs
    "_check_workers": (
        "test_worker_death.py::test_key_dispatched_to_a_worker_that_dies_before_starting_it_is_failed",
        "test_worker_death.py::test_workload_runs_after_every_idle_worker_is_killed",
    ),
}

# Methods that stay but whose contract changes: upstream tests that call them the old way break.
CHANGED_SEMANTICS: dict[str, str] = {
    "_check_workers": "reaps dead workers and fails their keys; an unstarted executor with mocked "
    "queues is no longer a valid input",
}


@dataclass(frozen=True)
class Removed:
    name: str
    scope: str  # "module" or "LocalExecutor"
    how: str  # "removed", "renamed to X", "semantics changed: ..."

    @property
    def qualified(self) -> str:
        return f"local_executor.{self.name}" if self.scope == "module" else f"{self.scope}.{self.name}"


@dataclass(frozen=True)
class Hit:
    path: str  # repository path of the test file
    test: str  # Class.test_name, a helper's name, or "(module level)"
    line: int
    name: str
    how: str  # "attribute", "string", "import", "name"


@dataclass
class Finding:
    hit: Hit
    removed: Removed
    ours: list[str] = field(default_factory=list)  # our equivalent tests present in the PR


# -------------------------------------------------------------------- what the PR removes


def module_names(tree: ast.Module) -> dict[str, ast.AST]:
    """A module's global names (functions, classes, assignments, imports) -> the statement binding each."""
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names |= {s.id: node for t in node.targets for s in ast.walk(t) if isinstance(s, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0]: node for alias in node.names}
    return names


def _class_names(tree: ast.Module, cls: str) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                names[item.name] = item
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                names[item.target.id] = item
            elif isinstance(item, ast.Assign):
                names |= {t.id: item for t in item.targets if isinstance(t, ast.Name)}
        for sub in ast.walk(node):
            targets: list[ast.expr] = []
            if isinstance(sub, ast.Assign):
                targets = list(sub.targets)
            elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
                targets = [sub.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    names.setdefault(target.attr, sub)
    return names


def _body_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return ast.dump(ast.Module(body=node.body, type_ignores=[]))
    return None


def removed_internals(before: str, after: str) -> list[Removed]:
    """Module-level names and LocalExecutor members in ``before`` that ``after`` lacks (or whose
    contract ``CHANGED_SEMANTICS`` says changed, when their code changed)."""
    old, new = ast.parse(before), ast.parse(after)
    out: list[Removed] = []
    for scope, a, b in (
        ("module", module_names(old), module_names(new)),
        (EXECUTOR_CLASS, _class_names(old, EXECUTOR_CLASS), _class_names(new, EXECUTOR_CLASS)),
    ):
        added = {n: _body_key(node) for n, node in b.items() if n not in a}
        for name in sorted(set(a) - set(b)):
            key = _body_key(a[name])
            twin = next((n for n, k in sorted(added.items()) if key is not None and k == key), None)
            out.append(Removed(name, scope, f"renamed to {twin}" if twin else "removed"))
        for name in sorted(set(a) & set(b)):
            if (
                name in CHANGED_SEMANTICS
                and scope == EXECUTOR_CLASS
                and ast.dump(a[name]) != ast.dump(b[name])
            ):
                out.append(Removed(name, scope, f"semantics changed: {CHANGED_SEMANTICS[name]}"))
    if any(r.name == EXECUTOR_CLASS for r in out):
        raise ValueError(f"the change removes {EXECUTOR_CLASS} itself")
    return out


# -------------------------------------------------------------------- where tests use them


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, names: set[str]) -> None:
        self.path = path
        self.names = names
        self.scope: list[str] = []
        self.imported: dict[str, str] = {}  # local alias -> removed name, from the executor module
        self.hits: list[Hit] = []

    def _hit(self, node: ast.AST, name: str, how: str) -> None:
        where = ".".join(self.scope) if self.scope else "(module level)"
        self.hits.append(Hit(self.path, where, getattr(node, "lineno", 0), name, how))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)  # @mock.patch("...") belongs to the test it decorates
        self.scope.append(node.name)
        for child in node.body:
            self.visit(child)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        for deco in node.decorator_list:
            self.visit(deco)
        if isinstance(node, ast.FunctionDef):  # an async def's arguments are not scanned
            self.visit(node.args)
        for child in node.body:
            self.visit(child)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == EXECUTOR_MODULE:
            for alias in node.names:
                if alias.name in self.names:
                    self.imported[alias.asname or alias.name] = alias.name
                    self._hit(node, alias.name, "import")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in self.names:
            self._hit(node, node.attr, "attribute")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.imported and self.scope:
            self._hit(node, self.imported[node.id], "name")

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str):
            return
        value = node.value.strip()
        if value in self.names:
            self._hit(node, value, "string")
        elif re.fullmatch(r"[\w.]+", value) and value.startswith(EXECUTOR_MODULE + "."):
            rest = value[len(EXECUTOR_MODULE) + 1 :].split(".")
            for part in rest:
                if part in self.names:
                    self._hit(node, part, "string")


def scan_tests(files: Mapping[str, bytes], names: Iterable[str]) -> list[Hit]:
    """Every use of ``names`` in the given test files (path -> source), in file and line order."""
    wanted = set(names)
    hits: list[Hit] = []
    for path in sorted(files):
        try:
            tree = ast.parse(files[path].decode("utf-8", "replace"), filename=path)
        except SyntaxError:
            continue
        scanner = _Scanner(path, wanted)
        scanner.visit(tree)
        seen: set[tuple[str, str, str]] = set()
        for hit in sorted(scanner.hits, key=lambda h: h.line):
            if (hit.test, hit.name, hit.how) not in seen:
                seen.add((hit.test, hit.name, hit.how))
                hits.append(hit)
    return hits


def test_functions(files: Mapping[str, bytes]) -> set[str]:
    """``file.py::test`` (and ``file.py::Class::test``) of every test in the given files."""
    found: set[str] = set()
    for path, data in files.items():
        base = path.rsplit("/", 1)[-1]
        try:
            tree = ast.parse(data.decode("utf-8", "replace"))
        except SyntaxError:
            continue
        found |= {f"{base}::{name}" for name in upstream_tests.test_nodes(tree)}
    return found


def findings(
    removed: list[Removed],
    hits: list[Hit],
    our_tests: set[str],
    equivalents: Mapping[str, tuple[str, ...]] = EQUIVALENTS,
) -> list[Finding]:
    by_name = {r.name: r for r in removed}
    return [
        Finding(hit, by_name[hit.name], [t for t in equivalents.get(hit.name, ()) if t in our_tests])
        for hit in hits
    ]


def render(removed: list[Removed], found: list[Finding], scanned: int, our_dir: str) -> str:
    """The PR body's section: what goes, and every upstream test that still uses it."""
    lines = ["### Upstream tests that use internals this PR removes", ""]
    if not removed:
        lines.append("This PR removes no module-level name and no `LocalExecutor` attribute or method.")
        return "\n".join(lines)
    lines.append(
        "Removed or changed here: "
        + ", ".join(f"`{r.qualified}` ({r.how.split(':')[0]})" for r in removed)
        + "."
    )
    lines.append("")
    if not found:
        lines.append(f"None of the {scanned} test files under `{TESTS_ROOT}` uses them.")
        return "\n".join(lines)
    lines.append(
        f"{len(found)} use(s) in {len({f.hit.path for f in found})} of the {scanned} test files under "
        f"`{TESTS_ROOT}`; each needs updating or removing in this PR. Where a test of ours checks the "
        f"same behaviour through the executor's public surface, it is named (in `{our_dir}/`):"
    )
    lines += ["", "| file | test | uses | checked here by |", "|---|---|---|---|"]
    for f in found:
        ours = "<br>".join(f"`{t}`" for t in f.ours) or "no equivalent"
        where = f"`{f.hit.path}:{f.hit.line}`"
        lines.append(f"| {where} | `{f.hit.test}` | `{f.removed.qualified}` ({f.hit.how}) | {ours} |")
    return "\n".join(lines)

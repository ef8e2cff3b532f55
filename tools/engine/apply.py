"""The apply engine: base + series -> stage trees per release line, and the derived files.

For each pinned line the base ``local_executor.py`` is committed in a throwaway git
repository at its Airflow repository path, then the patches are applied one at a time:

1. ``git apply --index`` with full context (strict, no fuzz)             -> ``clean``
2. if the patch records full blob ids: ``git apply --3way --index`` with the primary
   line's stage k-1 blobs hashed into the repository, accepted only without conflicts
                                                                           -> ``3-way``
3. a recorded ``patches/resolutions/<line>/<patch>`` takes precedence over 1 and 2: the
   patch is applied without the files the resolution covers, then the resolution
                                                                           -> ``resolution``

anything else is ``FAILED`` with the hunk and line, and the later patches are not tried.

``n/a``: the patch fixes only upstream files the line does not pin (none of them is in its base:
the API server's revoked-token check arrived in 3.2); its test files are applied alone.

``upstream``: a line whose base already carries a patch's change (3.4 ships what patches 1-3
backport). Decided from the trees, before any apply is tried: the change of patches 1..k on
the primary line (its stage k against its base) is contained in the line's base, that is
every line it adds to ``local_executor.py`` is there and every line it removes for good is
gone, up to a few lines (``UPSTREAM_SLACK_FRACTION``) that the backport words for the older API.
Upstream patches form a prefix of the series; their test files are still applied, and the
lines that did not match are recorded in ``build/apply.json`` for a reviewer to check, and
``python -m tools faithful`` compares the functions those patches touch, line by line.
Stage k of a line is its base plus the first k patches. The derived files (each line's
overlay, ``tests/executor/`` from the primary line) are written only after every line
applied, so a failure changes nothing in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.engine import churn, fetch
from tools.engine.series import Patch, Series, load_series, read_patch
from tools.shared import pins, table
from tools.shared.errors import ToolError
from tools.shared.gitcmd import TOOL_IDENT, GitError, git
from tools.shared.layout import DEFAULT, REPO_TESTS_DIR, Layout
from tools.shared.pins import Line

CLEAN = "clean"
THREE_WAY = "3-way"
RESOLUTION = "resolution"
UPSTREAM = "upstream"
# The line ships none of the upstream files the patch fixes (3.1 checks no revoked tokens): its
# tests are applied, its code has nothing to change, and its stage equals the one before.
NOT_APPLICABLE = "n/a"
FAILED = "FAILED"
APPLIED = (CLEAN, THREE_WAY, RESOLUTION, UPSTREAM, NOT_APPLICABLE)
NOT_TRIED = "-"

OVERLAY_PATH = pins.PACKAGE_PATH  # inside airflow_overlay/<line>/
STAGE_MARKER = ".lepatch-stage"

Tree = dict[str, bytes]


@dataclass
class PatchResult:
    name: str
    status: str
    detail: str = ""  # one line; for FAILED the error
    hint: str = ""  # further lines: how to reproduce and finish by hand
    # For UPSTREAM: the lines of the cumulative change the base words differently (older API).
    unmatched: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"patch": self.name, "status": self.status, "detail": self.detail}
        out["hint"] = self.hint
        if self.unmatched:
            out["unmatched"] = list(self.unmatched)
        return out


@dataclass
class LineResult:
    line: Line
    patches: list[PatchResult]
    stages: list[Tree]  # stages[k] = base + first k patches; shorter when a patch failed

    @property
    def ok(self) -> bool:
        return all(p.status in APPLIED for p in self.patches)

    @property
    def final(self) -> int:
        return len(self.stages) - 1

    @property
    def upstream(self) -> frozenset[str]:
        """The patches this line's base already carries (a prefix of the series)."""
        return frozenset(p.name for p in self.patches if p.status == UPSTREAM)

    def stage(self, k: int | None = None) -> Tree:
        k = self.final if k is None else k
        if not 0 <= k < len(self.stages):
            raise ToolError(
                f"{self.line.name} has stages 0..{self.final}"
                + ("" if self.ok else " (a patch failed to apply)")
                + f", not {k}"
            )
        return self.stages[k]

    def code(self, k: int | None = None) -> bytes:
        tree = self.stage(k)
        if pins.REPO_PATH not in tree:
            raise ToolError(f"stage {k} of {self.line.name} has no {pins.REPO_PATH} (deleted by a patch?)")
        return tree[pins.REPO_PATH]

    def sources(self, k: int | None = None) -> dict[str, bytes]:
        """Every upstream file of stage ``k`` at its installed path (what a venv gets for that stage)."""
        tree = self.stage(k)
        return {f.package_path: tree[f.repo_path] for f in pins.UPSTREAM_FILES if f.repo_path in tree}

    def tests(self, k: int | None = None) -> Tree:
        prefix = REPO_TESTS_DIR + "/"
        return {p[len(prefix) :]: data for p, data in self.stage(k).items() if p.startswith(prefix)}

    def derived_tests(self, k: int | None = None) -> Tree:
        """The series' tests of every upstream file, at their paths in this repository."""
        out: Tree = {}
        for f in pins.UPSTREAM_FILES:
            prefix = f.repo_tests_dir + "/"
            for p, data in self.stage(k).items():
                if p.startswith(prefix):
                    out[f"{f.tests_dir}/{p[len(prefix) :]}"] = data
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line.name,
            "version": self.line.version,
            "ok": self.ok,
            "stages": len(self.stages),
            "patches": [p.to_json() for p in self.patches],
            "final_sha256": fetch.sha256_bytes(self.code()) if self.stages else None,
            "final_sources_sha256": (
                {p: fetch.sha256_bytes(d) for p, d in self.sources().items()} if self.stages else None
            ),
        }


@dataclass
class SdkReleaseResult:
    """The series' supervisor patches applied to another task-sdk release of a line."""

    line: Line
    version: str  # the task-sdk release
    patches: list[PatchResult]  # one per series patch that touches supervisor.py
    source: bytes  # the patched supervisor.py; empty when a patch failed

    @property
    def ok(self) -> bool:
        return all(p.status in APPLIED for p in self.patches)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_sdk": self.version,
            "ok": self.ok,
            "patches": [p.to_json() for p in self.patches],
            "final_sha256": fetch.sha256_bytes(self.source) if self.source else None,
        }


def sdk_release_dir(version: str) -> str:
    """Where a task-sdk release's own patched supervisor lives inside ``airflow_overlay/<line>/``."""
    return f"task-sdk-{version}"


def _read_tree(repo: Path) -> Tree:
    out = git("ls-files", "-z", cwd=repo, isolated=True)
    return {p: (repo / p).read_bytes() for p in out.split("\0") if p}


def _write_tree(tree: Tree, dest: Path) -> None:
    for rel, data in tree.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


# At most this share of the lines of a cumulative change may be worded differently in a base that
# is said to carry it (3.3's ``key = workload.key`` is 3.4's ``key = self.get_workload_key(workload)``):
# 3 of the 102 lines of patches 1-3. A small change must be found whole.
UPSTREAM_SLACK_FRACTION = 0.05


def _significant(source: bytes) -> list[str]:
    """Stripped lines that say something: no blank lines, no comment-only lines."""
    out = []
    for raw in source.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def upstream_unmatched(before: bytes, after: bytes, base: bytes) -> list[str] | None:
    """
    Lines of the change ``before`` -> ``after`` that ``base`` does not reflect, or None if too many.

    A line the change adds must be in ``base``; a line it removes for good (no longer anywhere in
    ``after``) must not be. Returns the exceptions when they are few enough to be wording for an
    older API, else None: the base does not carry the change.
    """
    import difflib

    old, new, have = _significant(before), _significant(after), set(_significant(base))
    added: list[str] = []
    removed: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            removed.extend(old[i1:i2])
        if tag in ("replace", "insert"):
            added.extend(new[j1:j2])
    if not added and not removed:
        return None  # an empty change (a test-only patch) is not evidence of anything
    still = set(new)
    missing = [f"+ {line}" for line in dict.fromkeys(added) if line not in have]
    lingering = [f"- {line}" for line in dict.fromkeys(removed) if line not in still and line in have]
    unmatched = missing + lingering
    allowed = int(UPSTREAM_SLACK_FRACTION * (len(added) + len(removed)))
    return unmatched if len(unmatched) <= allowed else None


def _has_conflict_markers(repo: Path, paths: Iterable[str]) -> bool:
    marker = re.compile(rb"^(<{7}|>{7}) ", re.M)
    return any((repo / p).is_file() and marker.search((repo / p).read_bytes()) for p in paths)


class Engine:
    """Applies the series of ``layout`` to ``lines``; results are computed once and kept."""

    def __init__(
        self,
        layout: Layout = DEFAULT,
        lines: Sequence[Line] = pins.LINES,
        base: Callable[[Line], bytes] | None = None,
        bases: Callable[[Line], Tree] | None = None,
    ):
        self.layout = layout
        self.lines = tuple(lines)
        # Every upstream file a line pins, at its repository path; ``base`` (the tests' synthetic
        # lines) gives the executor alone, ``bases`` every file.
        self._bases: Callable[[Line], Tree] = (
            bases
            if bases is not None
            else (lambda line: {pins.REPO_PATH: base(line)})
            if base is not None
            else (lambda line: fetch.read_bases(line, layout))
        )
        self._series: Series | None = None
        self._results: dict[str, LineResult] = {}
        self._sdk_results: dict[tuple[str, str], SdkReleaseResult] = {}
        # why injectable: the tests' synthetic lines have no task-sdk wheels to read
        self._sdk_base: Callable[[pins.Pin], bytes] = lambda pin: fetch.read_pinned(pin, layout)

    @property
    def primary(self) -> Line:
        return self.lines[0]

    @property
    def series(self) -> Series:
        if self._series is None:
            self._series = load_series(self.layout)
        return self._series

    def line(self, line: Line | str) -> Line:
        name = line.name if isinstance(line, Line) else line
        for candidate in self.lines:
            if name in (candidate.name, candidate.version) or name in candidate.covers:
                return candidate
        known = ", ".join(f"{c.name} ({c.version})" for c in self.lines)
        raise ToolError(f"unknown release line {name!r}; pinned lines: {known}")

    # -- applying ---------------------------------------------------------------------

    def apply_line(self, line: Line | str) -> LineResult:
        """Apply the series to one line (the primary first, for its 3-way pre-images)."""
        line = self.line(line)
        if line.name in self._results:
            return self._results[line.name]
        primary = None if line == self.primary else self.apply_line(self.primary)
        with tempfile.TemporaryDirectory(prefix=f"lepatch-{line.name}-") as tmp:
            result = self._apply_in(Path(tmp), line, primary)
        self._results[line.name] = result
        return result

    def apply_all(self, lines: Iterable[Line | str] | None = None) -> dict[str, LineResult]:
        chosen = [self.line(x) for x in lines] if lines else list(self.lines)
        return {line.name: self.apply_line(line) for line in chosen}

    def _apply_in(self, repo: Path, line: Line, primary: LineResult | None) -> LineResult:
        git("init", "-q", str(repo), isolated=True)
        base_tree = self._bases(line)
        _write_tree(base_tree, repo)
        git("add", "-A", cwd=repo, isolated=True)
        self._commit(repo, f"base: {pins.DISTRIBUTION} {line.version}")
        stages: list[Tree] = [base_tree]
        results: list[PatchResult] = []
        for k, name in enumerate(self.series.names, 1):
            if results and results[-1].status in (FAILED, NOT_TRIED):
                results.append(PatchResult(name, NOT_TRIED, "not tried: an earlier patch failed"))
                continue
            pre = primary.stages[k - 1] if primary is not None and k - 1 < len(primary.stages) else None
            res = None
            if primary is not None and all(r.status == UPSTREAM for r in results):
                res = self._apply_upstream(repo, line, k, name, primary, base_tree[pins.REPO_PATH])
            if res is None:
                res = self._apply_patch(repo, line, k, name, pre)
            results.append(res)
            if res.status != FAILED:
                self._commit(repo, name)
                stages.append(_read_tree(repo))
        return LineResult(line, results, stages)

    def _commit(self, repo: Path, message: str) -> None:
        git(
            "commit",
            "-q",
            "--allow-empty",
            "--no-verify",
            "-m",
            message,
            cwd=repo,
            env=TOOL_IDENT,
            isolated=True,
        )

    def reset(self, repo: Path) -> None:
        git("reset", "-q", "--hard", "HEAD", cwd=repo, isolated=True)
        git("clean", "-q", "-fdx", cwd=repo, isolated=True)

    def try_apply(self, repo: Path, patch_file: Path, *extra: str) -> GitError | None:
        try:
            git("apply", "--index", *extra, str(patch_file), cwd=repo, isolated=True)
        except GitError as exc:
            self.reset(repo)
            return exc
        return None

    def try_3way(
        self, repo: Path, patch: Patch, patch_file: Path, pre: Tree | None, *extra: str
    ) -> str | None:
        """None when a conflict-free 3-way merge applied the patch, else why not."""
        if not patch.full_index:
            return "no 3-way: the patch has no full blob ids"
        if pre is not None:
            for f in patch.files:
                if f.old_path and f.old_path in pre:
                    git("hash-object", "-w", "--stdin", cwd=repo, input=pre[f.old_path], isolated=True)
        try:
            git("apply", "--3way", "--index", *extra, str(patch_file), cwd=repo, isolated=True)
        except GitError as exc:
            self.reset(repo)
            conflicted = re.findall(r"^Applied patch to '(.+)' with conflicts", exc.stderr, re.M)
            if conflicted:
                return f"3-way merge conflicts in {', '.join(conflicted)}"
            return "3-way: " + describe_apply_error(patch, exc.stderr)
        if _has_conflict_markers(repo, patch.touched):
            self.reset(repo)
            return "3-way merge left conflict markers"
        return None

    def _apply_upstream(
        self, repo: Path, line: Line, k: int, name: str, primary: LineResult, base: bytes
    ) -> PatchResult | None:
        """UPSTREAM (test files applied, code left as the base has it) if the base carries 1..k."""
        if k >= len(primary.stages) or self.series.resolution(line.name, name) is not None:
            return None
        before = primary.stages[0].get(pins.REPO_PATH, b"")
        after = primary.stages[k].get(pins.REPO_PATH, b"")
        if primary.stages[k - 1].get(pins.REPO_PATH) == after:
            return None  # a test-only patch: nothing to find in the base, apply it as usual
        unmatched = upstream_unmatched(before, after, base)
        if unmatched is None:
            return None
        patch_file = self.layout.patches / name
        patch = self.series.patches.get(name)
        if patch is not None and any(p != pins.REPO_PATH for p in patch.touched):
            err = self.try_apply(repo, patch_file, f"--exclude={pins.REPO_PATH}")
            if err is not None:
                return self._failure(line, k, patch, patch_file, err, note=" (its test files)")
        detail = f"already in {line.version}" + (
            f"; {len(unmatched)} line(s) worded for the older API" if unmatched else ""
        )
        return PatchResult(name, UPSTREAM, detail, unmatched=tuple(unmatched))

    def _apply_patch(self, repo: Path, line: Line, k: int, name: str, pre: Tree | None) -> PatchResult:
        patch = self.series.patches.get(name)
        patch_file = self.layout.patches / name
        if patch is None:
            return PatchResult(
                name, FAILED, f"FAILED: patches/series lists {name}, but the file does not exist"
            )
        resolution = self.series.resolution(line.name, name)
        unpinned = self._unpinned_code(line, patch)
        if resolution is None and unpinned:
            excludes = [f"--exclude={p}" for p in unpinned]
            err = self.try_apply(repo, patch_file, *excludes)
            if err is not None:
                return self._failure(line, k, patch, patch_file, err, note=" (its test files)")
            missing = ", ".join(Path(p).name for p in unpinned)
            return PatchResult(name, NOT_APPLICABLE, f"{line.version} has no {missing}: nothing to fix")
        if resolution is None:
            err = self.try_apply(repo, patch_file)
            if err is None:
                return PatchResult(name, CLEAN)
            why = self.try_3way(repo, patch, patch_file, pre)
            if why is None:
                return PatchResult(name, THREE_WAY)
            return self._failure(line, k, patch, patch_file, err, note=f" ({why})")
        # why: a recorded resolution wins over a conflict-free 3-way merge, which can still
        # be wrong for the line (3.3's workload.key on 3.1, say); it is what a person decided.
        covered = set(resolution.touched)
        excludes = [f"--exclude={p}" for p in sorted(covered)]
        if any(p not in covered for p in patch.touched):
            err = self.try_apply(repo, patch_file, *excludes)
            if err is not None and (why := self.try_3way(repo, patch, patch_file, pre, *excludes)):
                return self._failure(
                    line, k, patch, patch_file, err, note=f" (outside its resolution; {why})"
                )
        res_file = self.layout.resolutions / line.name / name
        err = self.try_apply(repo, res_file)
        if err is not None:
            return self._failure(line, k, resolution, res_file, err, what=f"resolution {line.name}/{name}")
        return PatchResult(name, RESOLUTION)

    def _unpinned_code(self, line: Line, patch: Patch) -> list[str]:
        """The upstream files ``patch`` changes that ``line`` pins no base of, when it changes no other.

        Empty when the patch changes any upstream file the line does pin: a patch is either for
        the line or not, never applied in part.
        """
        pinned = {pin.file.repo_path for pin in line.pins}
        code = [p for p in patch.touched if pins.upstream_file(p) is not None]
        if not code or any(p in pinned for p in code):
            return []
        return sorted(code)

    def _failure(
        self,
        line: Line,
        k: int,
        patch: Patch,
        patch_file: Path,
        err: GitError,
        note: str = "",
        what: str = "",
    ) -> PatchResult:
        where = describe_apply_error(patch, err.stderr)
        detail = f"FAILED: {what or patch.name} does not apply to {line.name} ({line.version}): {where}{note}"
        rel = shlex.quote(str(patch_file.resolve()))
        refresh = f"python -m tools refresh --line {line.name} DIR"
        if line == self.primary:
            refresh = "python -m tools refresh DIR"
        hint = (
            f"  to reproduce: python -m tools checkout --line {line.name} --upto {k - 1} DIR"
            f" && git -C DIR am -3 {rel}\n"
            f"  then resolve, `git -C DIR am --continue`, and record it: {refresh}"
        )
        return PatchResult(patch.name, FAILED, detail, hint)

    # -- the supervisor of a line's other task-sdk releases ---------------------------

    def apply_sdk_release(self, line: Line | str, pin: pins.Pin) -> SdkReleaseResult:
        """Apply the series' supervisor.py changes to ``pin``'s release, as its line applies them.

        Each core release requires its own task-sdk release, and their supervisor.py files
        differ. The patches touching it are applied to that file alone (``--include``): the
        release's own resolution (``patches/resolutions/<line>/task-sdk-<v>/<patch>``) if one is
        recorded, else the line's resolution if it covers supervisor.py, else the patch; strict,
        then 3-way against the line's stage before the patch.
        """
        line = self.line(line)
        key = (line.name, pin.version)
        if key in self._sdk_results:
            return self._sdk_results[key]
        lr = self.apply_line(line)
        path = pins.SUPERVISOR.repo_path
        include = f"--include={path}"
        results: list[PatchResult] = []
        with tempfile.TemporaryDirectory(prefix=f"lepatch-{line.name}-sdk-") as tmp:
            repo = Path(tmp)
            git("init", "-q", str(repo), isolated=True)
            _write_tree({path: self._sdk_base(pin)}, repo)
            git("add", "-A", cwd=repo, isolated=True)
            self._commit(repo, f"base: {pin.file.distribution} {pin.version}")
            for k, name in enumerate(self.series.names, 1):
                patch = self.series.patches.get(name)
                if patch is None or path not in patch.touched:
                    continue
                if results and results[-1].status in (FAILED, NOT_TRIED):
                    results.append(PatchResult(name, NOT_TRIED, "not tried: an earlier patch failed"))
                    continue
                own = self.layout.resolutions / line.name / sdk_release_dir(pin.version) / name
                line_res = self.series.resolution(line.name, name)
                if own.is_file():
                    patch_file, status, text = own, RESOLUTION, read_patch(own)
                elif line_res is not None and path in line_res.touched:
                    patch_file, status, text = (
                        self.layout.resolutions / line.name / name,
                        RESOLUTION,
                        line_res,
                    )
                else:
                    patch_file, status, text = self.layout.patches / name, CLEAN, patch
                err = self.try_apply(repo, patch_file, include)
                if err is not None:
                    pre = lr.stages[k - 1] if k - 1 < len(lr.stages) else None
                    if self.try_3way(repo, text, patch_file, pre, include) is not None:
                        where = describe_apply_error(text, err.stderr)
                        detail = (
                            f"FAILED: {patch_file.name} does not apply to {pin.file.distribution} "
                            f"{pin.version}'s {pins.SUPERVISOR.name} ({line.name} line): {where}"
                        )
                        hint = (
                            f"  record the release's own resolution as "
                            f"{self.layout.rel(own)} (a diff of {path} alone)"
                        )
                        results.append(PatchResult(name, FAILED, detail, hint))
                        continue
                    status = THREE_WAY if status == CLEAN else status
                results.append(PatchResult(name, status))
                self._commit(repo, name)
            ok = all(r.status in APPLIED for r in results)
            source = (repo / path).read_bytes() if ok else b""
        result = SdkReleaseResult(line, pin.version, results, source)
        self._sdk_results[key] = result
        return result

    def sdk_releases(self, line: Line | str) -> list[SdkReleaseResult]:
        line = self.line(line)
        return [self.apply_sdk_release(line, pin) for pin in line.sdk_release_pins]

    # -- stages and derived files ----------------------------------------------------

    def build_stage(self, line: Line | str, k: int | None, dest: Path) -> Path:
        """Write stage ``k`` (default: final) of ``line`` as a tree in Airflow's repo layout."""
        tree = self.apply_line(line).stage(k)
        if dest.exists() and any(dest.iterdir()):
            if not (dest / STAGE_MARKER).exists():
                raise ToolError(f"{dest} is not empty and was not written by `python -m tools stage`")
            shutil.rmtree(dest)
        dest.mkdir(parents=True, exist_ok=True)
        _write_tree(tree, dest)
        (dest / STAGE_MARKER).write_text(f"{self.line(line).name} {k}\n")
        return dest

    def derived(self, results: dict[str, LineResult]) -> dict[str, bytes]:
        """Relative path -> content of every derived file the given results determine."""
        files: dict[str, bytes] = {}
        for name, res in results.items():
            res.code()  # why: a stage without the executor is an error, not an overlay without it
            for path, data in res.sources().items():
                files[f"airflow_overlay/{name}/{path}"] = data
            for sdk in self.sdk_releases(res.line):
                if not sdk.ok:
                    raise ToolError(sdk.patches[-1].detail)
                rel = f"airflow_overlay/{name}/{sdk_release_dir(sdk.version)}/{pins.SUPERVISOR.package_path}"
                files[rel] = sdk.source
        files.update(self.apply_line(self.primary).derived_tests())
        return files

    def derived_scope(self, results: dict[str, LineResult]) -> list[Path]:
        """Directories whose every file (but caches) is derived."""
        scope = [self.layout.overlay / name / "airflow" for name in results]
        # why a glob: a task-sdk release dropped from the pins leaves a directory to remove
        scope += [d for name in results for d in sorted((self.layout.overlay / name).glob("task-sdk-*"))]
        return [*scope, *(self.layout.root / f.tests_dir for f in pins.UPSTREAM_FILES)]

    def _existing(self, scope: list[Path]) -> set[str]:
        found: set[str] = set()
        for d in scope:
            if d.is_dir():
                for p in d.rglob("*"):
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                        found.add(str(p.relative_to(self.layout.root)))
        return found

    def drift(self, results: dict[str, LineResult]) -> list[str]:
        """One line per derived path that is missing, differs or should not exist."""
        want = self.derived(results)
        problems = []
        for rel, data in sorted(want.items()):
            path = self.layout.root / rel
            if not path.is_file():
                problems.append(f"drift: {rel} is missing")
            elif path.read_bytes() != data:
                problems.append(f"drift: {rel} differs from base + series")
        for rel in sorted(self._existing(self.derived_scope(results)) - set(want)):
            problems.append(f"drift: {rel} is not produced by the series")
        return problems

    def write_derived(self, results: dict[str, LineResult]) -> list[str]:
        """Bring every derived file in line; return the paths changed."""
        want = self.derived(results)
        changed = []
        for rel, data in sorted(want.items()):
            path = self.layout.root / rel
            if path.is_file() and path.read_bytes() == data:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            changed.append(rel)
        for rel in sorted(self._existing(self.derived_scope(results)) - set(want)):
            (self.layout.root / rel).unlink()
            changed.append(rel)
        for d in self.derived_scope(results):
            if d.is_dir():
                for sub in sorted((p for p in d.rglob("*") if p.is_dir()), reverse=True):
                    if not any(sub.iterdir()):
                        sub.rmdir()
        return changed

    def test_tree_differences(self, results: dict[str, LineResult]) -> list[str]:
        """Lines whose final test tree is not the primary's (tests/executor runs on all)."""

        def repo_tests(res: LineResult) -> Tree:
            dirs = tuple(f.repo_tests_dir + "/" for f in pins.UPSTREAM_FILES)
            return {p: d for p, d in res.stage().items() if p.startswith(dirs)}

        ref = repo_tests(self.apply_line(self.primary))
        problems = []
        for name, res in results.items():
            if name == self.primary.name:
                continue
            tests = repo_tests(res)
            for rel in sorted(set(ref) | set(tests)):
                if ref.get(rel) != tests.get(rel):
                    problems.append(
                        f"tests differ: {rel} on {name} is not the same as on "
                        f"{self.primary.name} (the derived tests run unchanged on every line)"
                    )
        return problems


_DEFAULT_ENGINE: Engine | None = None


def default_engine() -> Engine:
    global _DEFAULT_ENGINE
    if _DEFAULT_ENGINE is None:
        _DEFAULT_ENGINE = Engine()
    return _DEFAULT_ENGINE


def apply_line(line: Line | str, engine: Engine | None = None) -> LineResult:
    """Statuses and stage trees of one line (computed once per process)."""
    return (engine or default_engine()).apply_line(line)


def build_stage(line: Line | str, k: int | None, dest: Path, engine: Engine | None = None) -> Path:
    """Write stage ``k`` of ``line`` (base + first k patches) under ``dest``; return ``dest``."""
    return (engine or default_engine()).build_stage(line, k, dest)


def describe_apply_error(patch: Patch, stderr: str) -> str:
    """ "hunk #2 at path:283" from git apply's stderr, or git's own first complaint."""
    m = re.search(r"patch failed: (.+):(\d+)$", stderr, re.M)
    if m:
        path, lineno = m.group(1), int(m.group(2))
        hunk = patch.hunk_at(path, lineno)
        number = f"hunk #{hunk.number}" if hunk else "a hunk"
        return f"{number} at {path}:{lineno}"
    for ln in stderr.splitlines():
        ln = ln.strip()
        if ln.startswith("error: "):
            return ln[len("error: ") :]
    return stderr.strip().splitlines()[0] if stderr.strip() else "git apply failed"


# -- CLI --------------------------------------------------------------------------------


def render_matrix(engine: Engine, results: dict[str, LineResult]) -> str:
    names = engine.series.names
    rows = [["patch", *(r.line.label for r in results.values())]]
    rows += [[name, *(r.patches[i].status for r in results.values())] for i, name in enumerate(names)]
    lines = table.render(rows, widths=[0, *(len(RESOLUTION) for _ in results)])
    if not names:
        lines.append("(patches/series lists no patches: every stage is the base)")
    return "\n".join(lines)


def render_sdk_matrix(engine: Engine, results: dict[str, LineResult]) -> str:
    """The supervisor patches on each other task-sdk release a line's core releases require."""
    sdks = [sdk for r in results.values() if r.ok for sdk in engine.sdk_releases(r.line)]
    if not sdks:
        return ""
    names = list(dict.fromkeys(p.name for sdk in sdks for p in sdk.patches))
    rows = [["supervisor.py patch", *(f"{sdk.line.name}: task-sdk {sdk.version}" for sdk in sdks)]]
    for name in names:
        rows.append(
            [name, *(next((p.status for p in sdk.patches if p.name == name), NOT_TRIED) for sdk in sdks)]
        )
    return "\n".join(table.render(rows, widths=[0, *(len(RESOLUTION) for _ in sdks)]))


def run_apply(
    engine: Engine,
    lines: Sequence[Line | str] | None = None,
    write: bool = False,
    json_path: Path | None = None,
    out: Any = sys.stdout,
) -> int:
    """The ``apply`` command: matrix, JSON, drift check or write. Returns the exit code."""
    started = time.monotonic()
    results = engine.apply_all(lines)
    print(render_matrix(engine, results), file=out)
    if sdk_matrix := render_sdk_matrix(engine, results):
        print(sdk_matrix, file=out)
    failures = [p for r in results.values() for p in r.patches if p.status == FAILED]
    failures += [
        p
        for r in results.values()
        if r.ok
        for s in engine.sdk_releases(r.line)
        for p in s.patches
        if p.status == FAILED
    ]
    for p in failures:
        print(p.detail, file=out)
        if p.hint:
            print(p.hint, file=out)
    ok = not failures
    report: dict[str, Any] = {
        "series": engine.series.names,
        "lines": {name: r.to_json() if r.stages else {} for name, r in results.items()},
        "task_sdk_releases": {
            name: [s.to_json() for s in engine.sdk_releases(r.line)] for name, r in results.items() if r.ok
        },
        "drift": [],
        "written": [],
        "test_tree_differences": [],
    }
    if ok:
        diffs = engine.test_tree_differences(results)
        report["test_tree_differences"] = diffs
        for d in diffs:
            print(d, file=out)
        ok = not diffs
    verdict = ""  # printed last, after the churn table: the line a reader (or a script) looks at
    if ok:
        if write:
            written = engine.write_derived(results)
            report["written"] = written
            for rel in written:
                print(f"wrote: {rel}", file=out)
            verdict = f"derived files: {len(written)} written"
        else:
            drift = engine.drift(results)
            report["drift"] = drift
            for d in drift:
                print(d, file=out)
            if drift:
                verdict = "derived files drifted: regenerate with `nox -s apply -- --write`"
                ok = False
            else:
                verdict = "derived files: up to date"
    else:
        verdict = "nothing written: fix the failure first"
    churns = [churn.line_churn(name, r.stages, engine.series) for name, r in results.items() if r.ok]
    report["churn"] = {c.line: c.to_json() for c in churns}
    if churns:
        print(churn.render_table(churns), file=out)
    print(verdict, file=out)
    report["ok"] = ok
    report["seconds"] = round(time.monotonic() - started, 2)
    json_path = json_path or engine.layout.build / "apply.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


def _cmd_apply(args: argparse.Namespace) -> int:
    return run_apply(default_engine(), args.line, args.write, args.json)


def _cmd_stage(args: argparse.Namespace) -> int:
    engine = default_engine()
    line = engine.line(args.line)
    res = engine.apply_line(line)
    k = res.final if args.stage is None else args.stage
    dest = args.out or engine.layout.build / "stages" / line.name / str(k)
    engine.build_stage(line, k, dest)
    print(dest)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("apply", help="apply the series to every line, check (or --write) derived files")
    p.add_argument(
        "--line", action="append", type=pins.line_arg, help="only this line (repeatable); default: all"
    )
    p.add_argument("--write", action="store_true", help="regenerate airflow_overlay/ and tests/executor/")
    p.add_argument("--json", type=Path, help="where to write the JSON report (default build/apply.json)")
    p.set_defaults(func=_cmd_apply)
    s = sub.add_parser("stage", help="write stage K of a line (base + first K patches) as a tree")
    s.add_argument("--line", required=True, type=pins.line_arg)
    s.add_argument("--stage", type=int, help="number of patches applied (default: all)")
    s.add_argument("--out", type=Path, help="destination (default build/stages/LINE/K)")
    s.set_defaults(func=_cmd_stage)

"""Churn: how much of what the series' own patches add to an upstream file a later patch removes.

The series is read one patch at a time, and a reviewer reads each of our patches as one step of
the final design; a line one patch adds and a later one removes again is reading (and review) spent
on something the final file does not have. Per line and upstream file, from the stage trees:

- ``added``: the lines our own patches (``Origin: vendor``) insert, each patch against the stage
  before it (difflib), summed over the patches;
- ``churn``: those of them a later patch deletes or rewrites. Every line carries the tag of the
  patch that introduced it (the base's lines none): lines difflib keeps keep their tag, inserted
  ones get the current patch's, and a deleted or replaced line whose tag is one of our patches
  counts for that patch. Base lines and upstream patches' lines are not ours to cut, so never count;
- the final file's size beside the base's: code lines (no blank, comment-only or docstring line)
  and functions (methods and nested functions included).

The target is churn at most ``TARGET_PERCENT`` of added, and every line is under it (1.7-1.8 %).
``lint-series`` holds a ratchet below it: ``CEILINGS`` records each line's churned lines of
``local_executor.py`` as measured when it was last lowered, and lint fails when churn rises above
it, naming the line and the figures; lower a ceiling to the new figure whenever a re-cut brings
churn down (lint says so). The ceiling counts lines, not a share: adding unrelated lines elsewhere
would lower the share without taking anything back.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from tools.engine.series import Series
from tools.shared import pins, table
from tools.shared.pins import UpstreamFile

TARGET_PERCENT = 5
# The ratchet, per line: churned lines of local_executor.py at most. The 18-patch series churned
# 331-334 lines per line (26 %: a handoff thread added by one patch and removed by a later one); the
# first re-cut into 10 patches 77-79 (7.5 %). Patches 7 and 8 now write the dispatch, reap and result
# paths in their final shape and patch 9 holds signals off with a decorator instead of re-indenting
# them, leaving 30-32 (3.0-3.2 %): a signature that gains a parameter, a check patch 9 widens. Raise
# one only where a fix goes into the patch that made the bug and must touch a line an earlier patch added.
# Issue 59 raised them to 22: patch 9 closes the descriptors multiprocessing keeps per worker and reads
# every results pipe with one registered poll(), rewriting 12 lines of patch 7's spawn, read and end paths
# (the fix belongs in patch 7, which made the cost; moving it there brings the ceilings back to 10).
CEILINGS: dict[str, int] = {"3.3": 22, "3.2": 22, "3.1": 22, "3.4": 22}
RATCHETED = pins.EXECUTOR

BASE = 0  # the tag of the base's lines: patch numbers start at 1

# Tokens that make no line a code line on their own.
_LAYOUT_TOKENS = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
        tokenize.ENCODING,
    }
)
_HAS_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class CodeSize:
    code_lines: int
    functions: int


@dataclass(frozen=True)
class FileChurn:
    file: str  # the upstream file's name: "local_executor.py"
    added: int
    churn: int
    base: CodeSize | None  # None when the file is not Python (the tests' synthetic lines)
    final: CodeSize | None
    added_by_patch: Mapping[str, int]
    churn_by_patch: Mapping[str, int]

    @property
    def percent(self) -> float:
        return 100.0 * self.churn / self.added if self.added else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "added": self.added,
            "churn": self.churn,
            "churn_percent": round(self.percent, 1),
            "base": None if self.base is None else vars(self.base),
            "final": None if self.final is None else vars(self.final),
            "added_by_patch": dict(self.added_by_patch),
            "churn_by_patch": dict(self.churn_by_patch),
        }


@dataclass(frozen=True)
class LineChurn:
    """One line's figures, one entry per upstream file its base has (the executor first)."""

    line: str
    files: tuple[FileChurn, ...]

    def file(self, name: str) -> FileChurn | None:
        return next((f for f in self.files if f.file == name), None)

    def to_json(self) -> dict[str, Any]:
        return {f.file: f.to_json() for f in self.files}


# -- measuring ---------------------------------------------------------------------------


def own_patches(series: Series) -> list[bool]:
    """Per patch of the series, in order: is it ours (``Origin: vendor``)?"""
    out = []
    for name in series.names:
        patch = series.patches.get(name)
        out.append(patch is not None and (patch.field("Origin") or "").strip() == "vendor")
    return out


def track(versions: Sequence[Sequence[str]], own: Sequence[bool]) -> tuple[dict[int, int], dict[int, int]]:
    """
    Lines added and churned per patch: ``versions[0]`` is the base, ``versions[k]`` the file after
    patch ``k`` (1-based), ``own[k - 1]`` whether patch ``k`` is ours. Both maps are keyed by patch
    number and hold only our patches.
    """
    tags = [BASE] * len(versions[0])
    added: dict[int, int] = {}
    churn: dict[int, int] = {}
    for k in range(1, len(versions)):
        before, after = versions[k - 1], versions[k]
        # why: autojunk off, or difflib treats lines common in a long file (blank lines, closing
        # brackets) as junk and reports kept lines as rewritten.
        opcodes = SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
        new_tags: list[int] = []
        for op, i1, i2, j1, j2 in opcodes:
            if op == "equal":
                new_tags += tags[i1:i2]
                continue
            for tag in tags[i1:i2]:  # deleted or replaced: empty for an insert
                if tag != BASE and own[tag - 1]:
                    churn[tag] = churn.get(tag, 0) + 1
            new_tags += [k] * (j2 - j1)
            if own[k - 1] and j2 > j1:
                added[k] = added.get(k, 0) + j2 - j1
        tags = new_tags
    return added, churn


def _docstring_spans(tree: ast.AST) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of every module, class and function docstring."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, _HAS_DOCSTRING) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                value = first.value
                end = (value.end_lineno or value.lineno, value.end_col_offset or 0)
                spans.append(((value.lineno, value.col_offset), end))
    return spans


def code_size(source: bytes) -> CodeSize | None:
    """Code lines and functions of a Python source; None if it does not parse."""
    try:
        text = source.decode("utf-8")
        tree = ast.parse(text)
    except (UnicodeDecodeError, SyntaxError):
        return None
    docstrings = _docstring_spans(tree)
    rows: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _LAYOUT_TOKENS:
            continue
        # why: an implicitly concatenated docstring is several STRING tokens inside one span.
        if tok.type == tokenize.STRING and any(s <= tok.start and tok.end <= e for s, e in docstrings):
            continue
        rows.update(range(tok.start[0], tok.end[0] + 1))  # a multi-line string covers each row
    functions = sum(isinstance(node, _FUNCTIONS) for node in ast.walk(tree))
    return CodeSize(len(rows), functions)


def file_churn(
    stages: Sequence[Mapping[str, bytes]], names: Sequence[str], own: Sequence[bool], file: UpstreamFile
) -> FileChurn | None:
    """The figures of one upstream file over ``stages`` (stage k after patch ``names[k - 1]``)."""
    if file.repo_path not in stages[0]:
        return None
    versions = [s.get(file.repo_path, b"").decode("utf-8", "replace").splitlines() for s in stages]
    added, churn = track(versions, own)
    return FileChurn(
        file=file.name,
        added=sum(added.values()),
        churn=sum(churn.values()),
        base=code_size(stages[0][file.repo_path]),
        final=code_size(stages[-1].get(file.repo_path, b"")),
        added_by_patch={names[k - 1]: n for k, n in sorted(added.items())},
        churn_by_patch={names[k - 1]: n for k, n in sorted(churn.items())},
    )


def line_churn(line: str, stages: Sequence[Mapping[str, bytes]], series: Series) -> LineChurn:
    """A line's figures from its stage trees (``stages[k]``: base + first k patches of ``series``)."""
    names, own = series.names, own_patches(series)
    found = (file_churn(stages, names, own, f) for f in pins.UPSTREAM_FILES)
    return LineChurn(line, tuple(f for f in found if f is not None))


# -- reporting ---------------------------------------------------------------------------


def _size(base: CodeSize | None, final: CodeSize | None, field: str) -> str:
    if base is None or final is None:
        return "-"
    return f"{getattr(base, field)} -> {getattr(final, field)}"


def render_table(churns: Iterable[LineChurn]) -> str:
    """One row per line and file: added, churn and its share, size of the base -> the final file."""
    head = ("line", "file", "added", "churn", "churn %", "code lines", "functions")
    rows = [head]
    for lc in churns:
        for f in lc.files:
            rows.append(
                (
                    lc.line,
                    f.file,
                    f"{f.added:,}",
                    f"{f.churn:,}",
                    f"{f.percent:.1f} %",
                    _size(f.base, f.final, "code_lines"),
                    _size(f.base, f.final, "functions"),
                )
            )
    # why: line and file read left-aligned, the figures right-aligned (digits under digits)
    lines = table.render(rows, right=range(2, len(head)))
    title = (
        f"churn: lines our patches add that a later patch removes (target {TARGET_PERCENT} % of added);"
        " code lines and functions: base -> final"
    )
    return "\n".join([title, *lines])


def _target_lines(added: int) -> int:
    return added * TARGET_PERCENT // 100


def ratchet(churns: Iterable[LineChurn], ceilings: Mapping[str, int] = CEILINGS) -> list[str]:
    """One line per line whose churn of the ratcheted file is above its ceiling, or has none."""
    errors = []
    for lc in churns:
        f = lc.file(RATCHETED.name)
        if f is None:
            continue
        ceiling = ceilings.get(lc.line)
        figures = f"{f.churn:,} of {f.added:,} added lines removed again by a later patch ({f.percent:.1f} %)"
        target = f"target {TARGET_PERCENT} %: {_target_lines(f.added):,} lines"
        if ceiling is None:
            errors.append(
                f"churn: {lc.line} {f.file}: {figures}; no ceiling recorded for {lc.line} "
                f"(add it to CEILINGS in tools/engine/churn.py; {target})"
            )
        elif f.churn > ceiling:
            errors.append(
                f"churn: {lc.line} {f.file}: {figures}, above the ceiling {ceiling:,} "
                f"({target}): a patch takes out what an earlier one of ours added; fold the change back"
            )
    return errors


def ratchet_notes(churns: Iterable[LineChurn], ceilings: Mapping[str, int] = CEILINGS) -> list[str]:
    """Where each line stands against its ceiling and the target; says when a ceiling can come down."""
    notes = []
    for lc in churns:
        f = lc.file(RATCHETED.name)
        ceiling = ceilings.get(lc.line)
        if f is None or ceiling is None or f.churn > ceiling:
            continue  # no figure, or ratchet() reports it
        note = (
            f"churn: {lc.line} {f.file}: {f.churn:,} of {f.added:,} added ({f.percent:.1f} %), "
            f"ceiling {ceiling:,}, target {TARGET_PERCENT} % ({_target_lines(f.added):,} lines)"
        )
        if f.churn < ceiling:
            note += f"; lower CEILINGS[{lc.line!r}] in tools/engine/churn.py to {f.churn} to keep the gain"
        notes.append(note)
    return notes

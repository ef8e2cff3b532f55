"""``python -m tools faithful``: does a backport read like what upstream released?

Patches 1-3 backport what the upstream line (the pre-release standing in for main, 3.4) already
ships. For a release line, this compares every function those patches touch, as the line's
stage has it after them, with the same function in the upstream line's base, and lists the
lines that differ. A faithful backport differs only where the older API forces it (3.3's
``workload.key`` for 3.4's ``get_workload_key()``); anything else is a divergence a release
manager would trip over when cherry-picking upstream's own commits.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import textwrap
from dataclasses import dataclass
from typing import Any

from tools.engine import apply as engine_mod
from tools.shared import pins
from tools.shared.errors import ToolError


@dataclass
class FunctionDiff:
    name: str  # "LocalExecutor.end", "_run_worker", "<module>" for imports and assignments
    status: str  # "same", "differs", "missing upstream", "missing here"
    lines: list[str]  # "- ours" / "+ upstream" lines when it differs


def functions(source: str) -> dict[str, str]:
    """Qualified name -> dedented source of every function and method; ``<module>`` for the rest."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[str, str] = {}
    covered: set[int] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                end = child.end_lineno or child.lineno
                found[prefix + child.name] = textwrap.dedent("\n".join(lines[start - 1 : end]))
                covered.update(range(start, end + 1))
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    rest = [ln for i, ln in enumerate(lines, 1) if i not in covered and ln.strip()]
    found["<module>"] = "\n".join(rest)
    return found


def touched(before: str, after: str) -> list[str]:
    """Names (as ``functions`` gives them) whose source differs between two versions of a file."""
    old, new = functions(before), functions(after)
    return [name for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def compare(ours: str, upstream: str, names: list[str]) -> list[FunctionDiff]:
    mine, theirs = functions(ours), functions(upstream)
    out = []
    for name in names:
        if name not in mine:
            out.append(FunctionDiff(name, "missing here", []))
            continue
        if name not in theirs:
            out.append(FunctionDiff(name, "missing upstream", []))
            continue
        a, b = mine[name].splitlines(), theirs[name].splitlines()
        delta = [
            ln
            for ln in difflib.unified_diff(a, b, lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
        ]
        out.append(FunctionDiff(name, "differs" if delta else "same", delta))
    return out


def report(engine: engine_mod.Engine, line: pins.Line, upstream: pins.Line) -> tuple[int, list[FunctionDiff]]:
    k = len(engine.apply_line(upstream).upstream)  # they form a prefix of the series
    if k == 0:
        raise ToolError(f"no patch of the series is upstream on {upstream.label}: nothing to compare")
    res = engine.apply_line(line)
    before, after = res.code(0).decode(), res.code(k).decode()
    base = engine.apply_line(upstream).code(0).decode()
    return k, compare(after, base, touched(before, after))


def _cmd_faithful(args: argparse.Namespace) -> int:
    engine = engine_mod.default_engine()
    upstream = next((ln for ln in engine.lines if ln.prerelease), None)
    if upstream is None:
        raise ToolError("no pre-release line is pinned to stand in for upstream main")
    data: dict[str, Any] = {}
    for chosen in args.line or [ln for ln in engine.lines if ln != upstream]:
        line = engine.line(chosen)
        k, diffs = report(engine, line, upstream)
        print(f"{line.label}, stage {k} against {upstream.label}:")
        for d in diffs:
            print(f"  {d.name:<44} {d.status}" + (f" ({len(d.lines)} lines)" if d.lines else ""))
            for ln in d.lines:
                print(f"      {ln}")
        data[line.name] = [{"function": d.name, "status": d.status, "lines": d.lines} for d in diffs]
    if args.json:
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from pathlib import Path

    p = sub.add_parser(
        "faithful", help="compare what the upstream patches touch on a line with the upstream base"
    )
    help_ = "only this line (repeatable); default: every release line"
    p.add_argument("--line", action="append", type=pins.line_arg, help=help_)
    p.add_argument("--json", type=Path, help="also write the comparison as JSON")
    p.set_defaults(func=_cmd_faithful)

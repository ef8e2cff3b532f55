"""What the docs' tests read: the Markdown files a reader follows, their code, and what it may name.

Shared by test_doc_commands.py (each quoted command parses) and test_doc_names.py (each name is one
the tools make today).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
from pathlib import Path

from tools.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# Indented too: a fence inside a list item is still code, and missing it would pair every later
# backtick wrongly.
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", flags=re.M | re.S)
_NOXFILE = ROOT / "noxfile.py"


def snippets(text: str) -> list[tuple[str, bool]]:
    """The lines of fenced code blocks (examples), and every inline code span (joined if it wraps
    a line): an example too, unless it is a bare session or command name mentioned in prose."""
    out = [(ln, True) for block in FENCE.findall(text) for ln in block.splitlines()]
    rest = FENCE.sub("", text)
    for span in re.findall(r"`([^`]+)`", rest):
        span = " ".join(span.split())
        out.append((span, not re.fullmatch(r"(nox -s|python3? -m tools) [\w-]+", span)))
    return out


def _session_functions() -> list[ast.FunctionDef]:
    """noxfile.py's functions decorated with ``@nox.session`` (read, not imported: no nox needed)."""
    found = []
    for node in ast.parse(_NOXFILE.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target) == "nox.session":
                    found.append(node)
    return found


def nox_sessions() -> set[str]:
    """The session names of noxfile.py."""
    return {fn.name for fn in _session_functions()}


def tool_sessions() -> dict[str, str]:
    """Each session that is a thin wrapper, ``run_tools(session, "COMMAND", ...)``: its command."""
    out = {}
    for fn in _session_functions():
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "run_tools" and len(call.args) > 1:
                command = call.args[1]
                if isinstance(command, ast.Constant) and isinstance(command.value, str):
                    out[fn.name] = command.value
    return out


def session_options(name: str) -> set[str]:
    """The ``--options`` a session that is no wrapper reads itself (``tests``: ``--line``)."""
    fn = next(f for f in _session_functions() if f.name == name)
    return {
        node.value
        for node in ast.walk(fn)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"--\w[\w-]*", node.value)
    }


def parses(argv: list[str]) -> str | None:
    """None if ``python -m tools *argv`` parses (``--help`` counts), else argparse's complaint."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                return err.getvalue().strip().splitlines()[-1]
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of ``parser`` and of any subcommand nested in it."""
    own = {opt for action in parser._actions for opt in action.option_strings}
    return own.union(*(_option_strings(sub) for sub in _subparsers(parser).values()))


def tool_commands() -> dict[str, set[str]]:
    """Each ``python -m tools`` subcommand, from the parser ``python -m tools`` builds: its options."""
    return {name: _option_strings(sub) for name, sub in _subparsers(build_parser()).items()}

"""Every command README.md, CONTRIBUTING.md and docs/*.md quote runs as written, checked without
doing the work.

Each ``nox -s SESSION [-- ARGS]`` names a session of noxfile.py, and the ARGS of a session that
wraps ``python -m tools COMMAND`` parse with that command's own argument parser (the dry form of
running it); each ``python -m tools COMMAND ARGS`` parses the same way. Examples that parse but
would be refused are checked too (``pr`` of a patch already upstream). The README's first
command is run for real on an externally managed Python (PEP 668) when this machine has one.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from doc_snippets import DOCS, FENCE, ROOT, nox_sessions, parses, snippets, tool_sessions

from tools.__main__ import build_parser
from tools.engine import testrun
from tools.engine.series import read_patch, read_series_names
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT

# Sessions that are thin wrappers over `python -m tools <same name>`.
TOOL_SESSIONS = {name for name, command in tool_sessions().items() if name == command}
_START = re.compile(r"(?:^|(?<=[\s/]))(nox -s |python3? -m tools )")


def commands(text: str) -> list[str]:
    """Each `nox -s ...` or `python -m tools ...` example, from its first word, comments dropped;
    a bare mention (`nox -s pr` in a sentence) as ``MENTION name``."""
    found = []
    for snippet, example in snippets(text):
        for part in re.sub(r"\s+#.*$", "", snippet).split("&&"):
            if m := _START.search(part):
                cmd = part[m.start(1) :].strip()
                found.append(cmd if example else f"MENTION {cmd}")
    return found


def doc_commands() -> list[tuple[str, str]]:
    found = [(doc.relative_to(ROOT).as_posix(), cmd) for doc in DOCS for cmd in commands(doc.read_text())]
    return list(dict.fromkeys(found))  # each distinct command of a file once


def refused(tool: str, args: list[str]) -> str | None:
    """Why a command that parses would still be refused, for the cases a reader copies."""
    if tool == "pr":
        ns = build_parser().parse_args([tool, *args])
        if ns.patch is None:  # --standalone N: a patch of patches/upstream-prs/, checked by its own tests
            return None
        names = read_series_names(DEFAULT.series_file)
        match = [n for n in names if n.split("-", 1)[0].lstrip("0") == ns.patch.lstrip("0")]
        if not match:
            return f"no patch {ns.patch} in the series"
        if (read_patch(DEFAULT.patches / match[0]).field("Applied-Upstream") or "no") != "no":
            return f"{match[0]} is already upstream: pr refuses it"
    if tool == "backport":
        ns = build_parser().parse_args([tool, *args])
        known = {ln.branch for ln in pins.LINES} | {ln.name for ln in pins.LINES}
        if unknown := [b for b in ns.branches if b not in known]:
            return f"not a pinned line's branch: {unknown}"
    return None


def problem(cmd: str, sessions: set[str]) -> str | None:
    if cmd.startswith("MENTION "):  # a name in prose: the session or command must exist
        words = cmd.split()[1:]
        if words[-1].isupper():  # a placeholder (`python -m tools COMMAND`), not a name
            return None
        if words[0] == "nox":
            return None if words[2] in sessions else f"no nox session {words[2]!r} in noxfile.py"
        return parses([words[3], "--help"])
    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        return f"cannot be split as a shell command ({exc})"
    if words[0] != "nox":
        tool_args = words[3:]
        return parses(tool_args) or (refused(tool_args[0], tool_args[1:]) if tool_args else None)
    session, args = words[2], words[3:]
    name, _, param = session.partition("(")
    if name not in sessions:
        return f"no nox session {name!r} in noxfile.py"
    if param and not re.fullmatch(r"line='([\d.]+|tools)'\)", param):
        return f"{session}: not a parametrization of {name}"
    if args and args[0] != "--":
        return f"arguments must follow `--`: {args}"
    posargs = args[1:]
    if name == "tests":  # the session takes out --line and --jobs, the rest goes to pytest
        args = testrun.split_posargs(posargs)
        if bad := parses([name, *args]):
            return bad
        try:
            testrun.cell_names(build_parser().parse_args([name, *args]).line)
        except ToolError as exc:
            return str(exc)
        return None
    if name in TOOL_SESSIONS:
        return parses([name, *posargs]) or refused(name, posargs)
    return None


def test_the_docs_quote_commands() -> None:
    found = doc_commands()
    assert {doc for doc, _ in found} >= {"README.md", "docs/verify.md", "docs/performance.md", "docs/e2e.md"}
    assert any(cmd.startswith("nox -s pr --") for _, cmd in found)


@pytest.mark.parametrize(("doc", "cmd"), doc_commands())
def test_every_quoted_command_runs_as_written(doc: str, cmd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # why: CONTRIBUTING's "Adding a pinned line" names the line its first step pins (3.5), and --line
    # is resolved as it is parsed
    if doc == "CONTRIBUTING.md":
        last = pins.LINES[-1]
        major, minor = last.name.split(".")
        name = f"{major}.{int(minor) + 1}"
        added = dataclasses.replace(last, name=name, version=f"{name}.0")
        monkeypatch.setattr(pins, "LINES", [*pins.LINES, added])
    assert problem(cmd, nox_sessions()) is None, f"{doc}: `{cmd}`: {problem(cmd, nox_sessions())}"


def test_the_check_catches_what_a_reader_would_trip_on() -> None:
    sessions = nox_sessions()
    assert "no nox session" in (problem("nox -s test", sessions) or "")
    assert "no nox session" in (problem("MENTION nox -s test", sessions) or "")
    assert problem("MENTION nox -s pr", sessions) is None and problem("nox -s pr", sessions)
    assert "invalid choice" in (problem("MENTION python -m tools lint", sessions) or "")
    assert problem("MENTION python -m tools COMMAND", sessions) is None
    assert "already upstream" in (problem("nox -s pr -- --repo ../airflow 3", sessions) or "")
    assert "unrecognized arguments" in (problem("python -m tools verify --lines 3.2", sessions) or "")
    assert "not a pinned line" in (problem("nox -s tests -- --line 3.9", sessions) or "")
    assert problem("nox -s pr -- --repo ../airflow 7 --generated-by 'X'", sessions) is None


def first_command() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks: list[str] = FENCE.findall(readme)
    return next(ln for block in blocks for ln in block.splitlines() if "venv" in ln)


def test_readme_commands_are_what_ci_runs() -> None:
    """.ci/run runs the README's first command (one line per &&) and its test command as written."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for part in first_command().split("&&"):
        assert part.strip() in ci
    assert any(ln.strip() == ".venv/bin/nox -s tests" for ln in ci)
    assert ".venv/bin/nox -s tests" in (ROOT / "README.md").read_text()
    pinned = (ROOT / "constraints" / "tools.txt").read_text()
    for name in ("nox", "uv", "virtualenv"):
        assert re.search(rf"^{name}==\S+", pinned, flags=re.M), f"constraints/tools.txt does not pin {name}"


def externally_managed_python() -> str | None:
    """A Python whose stdlib carries EXTERNALLY-MANAGED (Debian's, Ubuntu's) and that can make venvs."""
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if not candidate or not Path(candidate).is_file():
            continue
        probe = (
            "import sys, sysconfig, os, ensurepip, venv; "
            "print(sys.prefix == sys.base_prefix and "
            "os.path.isfile(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"
        )
        out = subprocess.run([candidate, "-c", probe], capture_output=True, text=True)
        if out.stdout.strip() == "True":
            return candidate
    return None


def test_first_command_works_on_an_externally_managed_python(tmp_path: Path) -> None:
    python = externally_managed_python()
    if python is None:
        reason = "no externally managed Python with venv here"
        if Path(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED").is_file():
            reason += " (this one is, but cannot make venvs: install python3-venv)"
        pytest.skip(reason)
    # A plain pip install is what PEP 668 refuses there (if that Python has pip at all).
    plain = subprocess.run(
        [python, "-m", "pip", "install", "--dry-run", "nox"], capture_output=True, text=True
    )
    if "No module named pip" not in plain.stderr:
        assert plain.returncode != 0 and "externally-managed-environment" in plain.stderr
    (tmp_path / "constraints").mkdir()
    shutil.copy(ROOT / "constraints" / "tools.txt", tmp_path / "constraints" / "tools.txt")
    # The README's command as written, but with that Python, and nox's version instead of apply.
    cmd = first_command().replace("python3 ", f"{shlex.quote(python)} ", 1)
    cmd = cmd.replace(".venv/bin/nox -s apply", ".venv/bin/nox --version")
    proc = subprocess.run(["sh", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pin = re.search(r"^nox==(\S+)", (ROOT / "constraints" / "tools.txt").read_text(), flags=re.M)
    assert pin and (proc.stdout + proc.stderr).strip().splitlines()[-1] == pin.group(1)
    assert (tmp_path / ".venv" / "bin" / "uv").exists()


def test_tests_session_runs_one_line(tmp_path: Path) -> None:
    """`nox -s tests -- --line tools` runs only that cell (pytest has no --line)."""
    nox = shutil.which("nox") or next(
        (str(p) for p in (ROOT / ".venv/bin/nox", ROOT / "build/ci-venv/bin/nox") if p.exists()), None
    )
    if nox is None:
        pytest.skip("nox is not on PATH nor in .venv/ (the README's first command puts it there)")
    proc = subprocess.run(
        [nox, "-s", "tests", "--", "--line", "tools", "--collect-only", "-q", "tests/tools/test_pins.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    assert "tests tools: ok" in out and "usage:" not in out
    assert "tests 3.3" not in out and "test_pins.py" in out


def test_nox_l_describes_each_session_for_its_user() -> None:
    """`nox -l` prints the noxfile's docstring and each session's: user-facing text, one line each."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    module = ast.get_docstring(tree) or ""
    assert module and ":func:" not in module and "install()" not in module
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in nox_sessions():
            doc = ast.get_docstring(node) or ""
            assert doc and "\n" not in doc.strip(), f"{node.name}: one line for nox -l"
            assert "``" not in doc and len(doc) <= 105, f"{node.name}: {doc!r}"

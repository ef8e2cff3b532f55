"""Every name README.md, CONTRIBUTING.md and docs/*.md give a reader is one the tools make today.

test_doc_commands.py parses each quoted command; this checks the names themselves, wherever they
are written: wheel files and package versions (tools/delivery/package.py's ``wheel_name``), nox
sessions (noxfile.py), ``python -m tools`` commands and the options quoted on their own (the parser
``python -m tools`` builds), patch files and numbers (patches/series), and the list of patches in
docs/design.md. The post-release of a wheel is the series length, so a literal wheel name goes stale
with every patch: the docs write ``.post<N>`` or a glob instead, and the last tests add a patch to a
copy of the series to prove a literal, or a missing design.md row, is reported.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_snippets import DOCS, ROOT, nox_sessions, session_options, snippets, tool_commands, tool_sessions

from tools.delivery import package
from tools.engine.series import read_series_names
from tools.shared import pins
from tools.shared.layout import DEFAULT, Layout

# Options of other programs the docs quote (git, pip, airflow): no parser here knows them.
FOREIGN_OPTIONS = {
    "--amend",
    "--no-edit",
    "--full-index",
    "--no-cache-dir",
    "--no-deps",
    "--find-links",
    "--extra-index-url",
    "--force-reinstall",
    "--upgrade",  # pip install's: the patched wheels over PyPI's build of the same release
    "--require-hashes",
    "--apps",  # airflow api-server's: which of its apps a process serves
}
_PLACEHOLDER = re.compile(r"<[^<>\s]*>")
_WHEEL = re.compile(rf"{package.WHEEL_DIST}-[\w.<>*?+-]*?\.whl")
# A package version outside a wheel name (a quoted error message): the line's base, .post, the length.
_VERSION = re.compile(r"\b\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?\.post(?:\d+\b|<[^<>\s]*>|\*)")
_PATCH_FILE = re.compile(r"\b(\d{4})-([\w.-]*?)\.patch\b")
_PATCH_NUMBER = re.compile(r"(?<![\w.-])00\d\d(?![\w.-]*\.patch)\b")
_PROSE_NUMBER = re.compile(r"\b(patch|patches|stage|stages) (\d+)(?:-(\d+))?\b")
_SESSION = re.compile(r"\bnox\s+-s\s+[\"']?([\w-]+)")
# why (?!-): `python -m tools --help` names no command; test_doc_commands parses it.
_COMMAND = re.compile(r"\bpython3?\s+-m\s+tools\s+(?!-)([\w-]+)")
_OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")


@dataclass(frozen=True)
class Made:
    """The names the tools make for a series: today's, or a simulated one's."""

    wheels: dict[str, str]  # line -> its wheel's file name
    requires: dict[str, str]  # line -> its wheel's Requires-Dist, as docs/package.md's table puts it
    versions: tuple[str, ...]
    patches: tuple[str, ...]  # patches/series, in order
    standalone: tuple[str, ...]  # patches/upstream-prs/list: named in the docs too, numbered apart


def made(layout: Layout = DEFAULT) -> Made:
    return Made(
        wheels={line.name: package.wheel_name(line, layout) for line in pins.LINES},
        requires={line.name: _requires(package.verified(line, layout)) for line in pins.LINES},
        versions=tuple(package.package_version(line, layout) for line in pins.LINES),
        patches=tuple(read_series_names(layout.series_file)),
        standalone=tuple(read_series_names(layout.upstream_prs / "list")),
    )


def _requires(v: package.Verified) -> str:
    pairs = (("apache-airflow-core", v.core), ("apache-airflow-task-sdk", v.task_sdk))
    # why the space: package.md reads `apache-airflow-core >=3.3.0,<=3.3.2`, the metadata has none
    return "; ".join(package.requirement(dist, vs).replace(dist, f"{dist} ", 1) for dist, vs in pairs)


def _matches(written: str, names: Iterable[str]) -> bool:
    """A literal must be one of ``names``; a placeholder (``<N>``) or glob must match one of them,
    so a pattern that fits no name the tools make (a renamed distribution, a dropped line) fails."""
    pattern = _PLACEHOLDER.sub("*", written)
    if pattern == written and not any(c in written for c in "*?["):
        return written in set(names)
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def stale_wheels(text: str, today: Made) -> list[str]:
    found = [f"wheel {w!r}" for w in _WHEEL.findall(text) if not _matches(w, today.wheels.values())]
    rest = _WHEEL.sub("", text)  # why: a wheel name's version is reported with the wheel, once
    found += [f"package version {v!r}" for v in _VERSION.findall(rest) if not _matches(v, today.versions)]
    return found


def stale_patches(text: str, today: Made) -> list[str]:
    numbers = {n.split("-", 1)[0] for n in today.patches}
    found = []
    for m in _PATCH_FILE.finditer(text):
        if "..." in m.group(2):  # `0003-....patch`: the number alone is the name
            if m.group(1) not in numbers:
                found.append(f"patch {m.group(0)!r}: no patch {m.group(1)} in patches/series")
        elif m.group(0) not in today.patches + today.standalone:
            found.append(f"patch file {m.group(0)!r}: not in patches/series nor patches/upstream-prs/list")
    found += [
        f"patch number {n}: not in patches/series" for n in _PATCH_NUMBER.findall(text) if n not in numbers
    ]
    return found


def numbers_past_the_series(text: str, today: Made) -> list[str]:
    """``patch 15``, ``patches 1-3``, ``stage 17``: no number beyond the series (stage 0 is the base)."""
    found = []
    for m in _PROSE_NUMBER.finditer(" ".join(text.split())):
        low = 0 if m.group(1).startswith("stage") else 1
        for n in filter(None, (m.group(2), m.group(3))):
            if not low <= int(n) <= len(today.patches):
                found.append(f"{m.group(0)!r}: the series has patches 1-{len(today.patches)}")
    return found


def unknown_sessions_and_commands(text: str) -> list[str]:
    """Every ``nox -s NAME`` and ``python -m tools NAME``, in code or not; NAME in capitals is a
    placeholder."""
    joined = " ".join(text.split())  # why: a name may wrap onto the next line
    sessions, commands = nox_sessions(), tool_commands()
    found = [f"nox session {s!r}" for s in _SESSION.findall(joined) if s not in sessions and not s.isupper()]
    found += [
        f"python -m tools {c!r}" for c in _COMMAND.findall(joined) if c not in commands and not c.isupper()
    ]
    return found


def _named(text: str) -> set[str]:
    """The sessions and tools commands a doc names; a span like `apply -- --write` names one too."""
    joined = " ".join(text.split())
    names = set(_SESSION.findall(joined)) | set(_COMMAND.findall(joined))
    names |= {span.split()[0] for span, _ in snippets(text) if span.split()}
    return names


def stray_options(text: str) -> list[str]:
    """An option quoted on its own (`--every-stage`, `restore --force`) must be one of a session or
    command the same doc names: test_doc_commands parses whole commands, not these."""
    commands, wrappers, sessions = tool_commands(), tool_sessions(), nox_sessions()
    known = set(FOREIGN_OPTIONS)
    for name in _named(text):
        if name in commands:
            known |= commands[name]
        if name in wrappers:
            known |= commands[wrappers[name]]
        elif name in sessions:
            known |= session_options(name)
    found = []
    for span, _ in snippets(text):
        if re.search(r"\bnox\s+-s\b|\bpython3?\s+-m\s+tools\b", span):
            continue  # a whole command: test_doc_commands parses it with its own parser
        found += [f"option {o!r} (in `{span}`)" for o in _OPTION.findall(span) if o not in known]
    return found


def package_table(text: str, today: Made) -> list[str]:
    """docs/package.md's `| line | wheel | requires |`: each row the wheel and requirements of its line."""
    rows = re.findall(r"^\| ([\d.]+) \| `([^`]+)` \| ([^|]+) \|$", text, flags=re.M)
    found = (
        []
        if {r[0] for r in rows} == set(today.wheels)
        else [f"the wheel table's lines: {[r[0] for r in rows]}"]
    )
    for line, wheel, requires in rows:
        if line in today.wheels and not _matches(wheel, [today.wheels[line]]):
            found.append(f"line {line}: wheel {wheel!r}, the build names it {today.wheels[line]!r}")
        want = today.requires.get(line)
        if requires.strip() != want:
            found.append(f"line {line}: requires {requires.strip()!r}, the wheel's metadata {want!r}")
    return found


def design_table(text: str) -> list[int]:
    """The patch numbers of design.md's table of the series (`| # | patch | ...`), in order."""
    table = re.search(r"^\| # \| patch \|.*\n\|[-| ]+\|\n((?:\|.*\n)*)", text, flags=re.M)
    assert table, "docs/design.md: no `| # | patch |` table"
    return [int(n) for n in re.findall(r"^\| (\d+) \|", table.group(1), flags=re.M)]


def design_lists_the_series(text: str, today: Made) -> list[str]:
    want = list(range(1, len(today.patches) + 1))
    got = design_table(text)
    return [] if got == want else [f"the table of patches lists {got}, patches/series has 1-{len(want)}"]


def stale_names(doc: Path, today: Made) -> list[str]:
    text = doc.read_text()
    found = stale_wheels(text, today) + stale_patches(text, today) + numbers_past_the_series(text, today)
    if doc.name == "design.md":
        found += design_lists_the_series(text, today)
    if doc.name == "package.md":
        found += package_table(text, today)
    return found


def _rel(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_name_is_what_the_tools_make(doc: Path) -> None:
    problems = stale_names(doc, made())
    assert not problems, f"{_rel(doc)}: " + "; ".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_session_command_and_option_exists(doc: Path) -> None:
    text = doc.read_text()
    problems = unknown_sessions_and_commands(text) + stray_options(text)
    assert not problems, f"{_rel(doc)}: " + "; ".join(problems)


def test_the_docs_name_what_is_checked() -> None:
    """Guards the extraction: if these stop matching, the checks above would pass on nothing."""
    text = "\n".join(doc.read_text() for doc in DOCS)
    assert _WHEEL.findall((ROOT / "docs" / "package.md").read_text())
    assert _PATCH_FILE.findall(text) and _PATCH_NUMBER.findall(text) and _PROSE_NUMBER.findall(text)
    assert {"package", "tests", "verify"} <= set(_SESSION.findall(text))
    assert {"refresh", "port"} <= set(_COMMAND.findall(text))
    assert len(design_table((ROOT / "docs" / "design.md").read_text())) == len(made().patches)


def test_the_checks_report_what_a_reader_would_trip_on() -> None:
    today = made()
    wheel = today.wheels["3.3"]
    assert stale_wheels(f"COPY dist/{wheel} /tmp/", today) == []
    assert stale_wheels(f"COPY dist/{wheel.replace('.post', '.post1')} /tmp/", today)
    assert stale_wheels(f"{package.WHEEL_DIST}-9.9.9.post<N>-py3-none-any.whl", today)  # no such line
    assert stale_wheels(f"{package.WHEEL_DIST}-{pins.LINES[0].version}.post*-py3-none-any.whl", today) == []
    row = f"| 3.2 | `{wheel}` | {today.requires['3.2']} |"  # the 3.3 wheel in 3.2's row
    assert package_table(row, today) == [
        "the wheel table's lines: ['3.2']",
        f"line 3.2: wheel {wheel!r}, the build names it {today.wheels['3.2']!r}",
    ]
    assert stale_patches("fixed_by('0003-drain-results-before-each-workload-put.patch')", today)
    assert stale_patches(f"`{today.patches[2]}`, `0003-....patch`, `{today.standalone[0]}`", today) == []
    assert stale_patches("port --to 3.2 0099 /tmp/p", today)
    assert numbers_past_the_series(f"patch {len(today.patches) + 1}", today)
    assert numbers_past_the_series("stage 0, patches 1-3", today) == []
    assert unknown_sessions_and_commands("`nox -s test`, python -m tools\nlint") == [
        "nox session 'test'",
        "python -m tools 'lint'",
    ]
    assert stray_options("`nox -s verify`: `--every-stage`, `--every-line`") == [
        "option '--every-line' (in `--every-line`)"
    ]
    assert (
        stray_options("`nox -s overlay`: `--release 3.3.2`; `nox -s tests -- --line 3.2`, `--line tools`")
        == []
    )


@pytest.fixture
def one_more_patch(tmp_path: Path) -> Layout:
    """A copy of patches/ whose series has one patch more, as when a patch is added."""
    patches = tmp_path / "patches"
    shutil.copytree(DEFAULT.patches, patches, ignore=shutil.ignore_patterns("*.patch"))
    n = len(made().patches) + 1
    with (patches / "series").open("a") as f:
        f.write(f"{n:04d}-a-patch-added-to-the-series.patch\n")
    return Layout(patches_dir=patches)


def test_a_literal_wheel_name_goes_stale_with_the_next_patch(one_more_patch: Layout) -> None:
    today, tomorrow = made(), made(one_more_patch)
    assert tomorrow.wheels != today.wheels  # the naming function follows the series length
    wheel, version = today.wheels["3.3"], today.versions[1]
    literal = f"COPY dist/{wheel} /tmp/\nairflow-localexecutor-patched {version} was verified"
    assert stale_wheels(literal, today) == []
    assert stale_wheels(literal, tomorrow) == [f"wheel {wheel!r}", f"package version {version!r}"]
    # What the docs write instead holds for both.
    for doc in DOCS:
        assert stale_wheels(doc.read_text(), tomorrow) == [], _rel(doc)


def test_adding_a_patch_without_updating_the_docs_fails(one_more_patch: Layout) -> None:
    tomorrow = made(one_more_patch)
    design = ROOT / "docs" / "design.md"
    assert stale_names(design, tomorrow) == [
        f"the table of patches lists {list(range(1, len(tomorrow.patches)))}, "
        f"patches/series has 1-{len(tomorrow.patches)}"
    ]

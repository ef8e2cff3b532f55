"""The patch series: ``patches/series``, the format-patch mails it names, and resolutions.

A patch is parsed into its mail headers (author, date, subject), its message, the DEP-3
block that closes the message, the files it touches and its hunks (so a failed apply can
be reported as "hunk #2 at file:line"). The checks of the conventions in CONTRIBUTING.md are
here; ``tools.lint`` (``lint-series``) runs them with the other packages' own.
"""

from __future__ import annotations

import email.header
import email.parser
import email.policy
import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout

# The one author of the series' own patches (Origin: vendor), in patches/ and resolutions/;
# upstream, backport and other patches keep their real authors.
SERIES_AUTHOR = "LocalExecutor series <series@localexecutor.invalid>"
REQUIRED_FIELDS = ("Origin", "Bug", "Forwarded", "Applied-Upstream", "Last-Update")
_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_BLOB_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")
_FIXED_BY_RE = re.compile(
    r"""\bmark\.fixed_by\(\s*(?:patch\s*=\s*)?(?:["']([^"']+)["']|([A-Za-z_][A-Za-z0-9_]*)\s*[,)])"""
)
_URL_RE = re.compile(r"^https?://\S+$")
# What ``python -m tools port`` leaves for a reviewer: a resolution recorded with either is unreviewed.
PORT_MARK = "# PORT:"
_UNREVIEWED_RE = re.compile(r"^\+(?:\s*# PORT:|(?:<{7}|={7}|>{7})(?: |$))")


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based within its file, as patch(1) counts
    old_start: int
    old_len: int
    new_start: int
    new_len: int


@dataclass
class FileDiff:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    old_blob: str = ""
    new_blob: str = ""
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def full_index(self) -> bool:
        return len(self.old_blob) >= 40 and len(self.new_blob) >= 40


@dataclass
class Patch:
    name: str
    text: str
    subject: str = ""
    author: str = ""
    date: str = ""
    message: str = ""  # the commit message after the subject (DEP-3 block included)
    fields: dict[str, str] = field(default_factory=dict)
    files: list[FileDiff] = field(default_factory=list)
    diff: str = ""

    @property
    def touched(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def full_index(self) -> bool:
        return bool(self.files) and all(f.full_index or not f.hunks for f in self.files)

    def field(self, name: str) -> str | None:
        for key, value in self.fields.items():
            if key.lower() == name.lower():
                return value
        return None

    def hunk_at(self, path: str, line: int) -> Hunk | None:
        """The hunk git reports as ``patch failed: path:line`` (its old start line)."""
        for f in self.files:
            if path in (f.old_path, f.new_path):
                exact = [h for h in f.hunks if h.old_start == line]
                if exact:
                    return exact[0]
                before = [h for h in f.hunks if h.old_start <= line]
                return before[-1] if before else (f.hunks[0] if f.hunks else None)
        return None


@dataclass
class Series:
    layout: Layout
    names: list[str]  # in order, as listed in patches/series
    patches: dict[str, Patch]  # only the names whose file exists and parses
    resolutions: dict[tuple[str, str], Patch]  # (line name, patch name) -> resolution
    problems: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.names)

    def ordered(self) -> list[Patch]:
        return [self.patches[n] for n in self.names if n in self.patches]

    def index(self, name: str) -> int:
        """1-based position in the series: stage ``index`` is the first that has the patch."""
        return self.names.index(name) + 1

    def resolution(self, line: str, name: str) -> Patch | None:
        return self.resolutions.get((line, name))


def _unfold(value: str) -> str:
    return re.sub(r"\r?\n[ \t]", " ", value).strip()


def _decode_header(value: str) -> str:
    return str(email.header.make_header(email.header.decode_header(_unfold(value))))


def _strip_subject(subject: str) -> str:
    return re.sub(r"^(\s*\[[^\]]*\])+\s*", "", subject).strip()


def parse_dep3(message: str) -> dict[str, str]:
    """Fields of the message's last paragraph, if every line of it is a DEP-3 field."""
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", message.strip("\n")) if p.strip()]
    if not paragraphs:
        return {}
    fields: dict[str, str] = {}
    last: str | None = None
    for raw in paragraphs[-1].splitlines():
        m = _FIELD_RE.match(raw)
        if m and not raw[0].isspace():
            last = m.group(1)
            fields[last] = m.group(2).strip()
        elif raw[:1] in (" ", "\t") and last is not None:
            fields[last] = (fields[last] + " " + raw.strip()).strip()
        else:
            return {}
    return fields


def _parse_diff(lines: list[str], start: int) -> tuple[list[FileDiff], int]:
    """Parse ``diff --git`` sections from ``lines[start]``; return them and the end index."""
    files: list[FileDiff] = []
    i = start
    n = len(lines)
    while i < n and lines[i].startswith("diff --git "):
        m = re.match(r"^diff --git a/(.*) b/(.*)$", lines[i].rstrip("\n"))
        a, b = (m.group(1), m.group(2)) if m else ("", "")
        fd = FileDiff(old_path=a, new_path=b)
        i += 1
        while i < n and not lines[i].startswith(("@@ ", "diff --git ")):
            ln = lines[i].rstrip("\n")
            if ln.startswith("--- "):
                fd.old_path = None if ln[4:] == "/dev/null" else ln[4:].removeprefix("a/")
            elif ln.startswith("+++ "):
                fd.new_path = None if ln[4:] == "/dev/null" else ln[4:].removeprefix("b/")
            elif ln.startswith("new file mode"):
                fd.old_path = None
            elif ln.startswith("deleted file mode"):
                fd.new_path = None
            elif ln.startswith("rename to "):
                fd.new_path = ln[len("rename to ") :]
            elif (bm := _BLOB_RE.match(ln)) is not None:
                fd.old_blob, fd.new_blob = bm.group(1), bm.group(2)
            elif not ln or not (ln[0].isalpha() or ln.startswith(("GIT binary", "literal", "delta"))):
                break
            i += 1
        while i < n and lines[i].startswith("@@ "):
            hm = _HUNK_RE.match(lines[i])
            if not hm:
                break
            old_len = int(hm.group(2)) if hm.group(2) is not None else 1
            new_len = int(hm.group(4)) if hm.group(4) is not None else 1
            fd.hunks.append(Hunk(len(fd.hunks) + 1, int(hm.group(1)), old_len, int(hm.group(3)), new_len))
            i += 1
            old_left, new_left = old_len, new_len
            while i < n and (old_left > 0 or new_left > 0):
                c = lines[i][:1]
                if c == " " or lines[i] in ("\n", ""):
                    old_left -= 1
                    new_left -= 1
                elif c == "-":
                    old_left -= 1
                elif c == "+":
                    new_left -= 1
                elif c != "\\":
                    break
                i += 1
            while i < n and lines[i].startswith("\\"):
                i += 1
        files.append(fd)
    return files, i


def parse_patch(name: str, text: str) -> Patch:
    """Parse a format-patch mail (or a bare diff) into a :class:`Patch`."""
    patch = Patch(name=name, text=text)
    lines = text.splitlines(keepends=True)
    first_diff = next((i for i, ln in enumerate(lines) if ln.startswith("diff --git ")), len(lines))
    head = "".join(lines[:first_diff])
    if head.startswith("From ") or re.match(r"^[A-Za-z-]+: ", head):
        header_text, _, body = head.partition("\n\n")
        msg = email.parser.Parser(policy=email.policy.compat32).parsestr(
            header_text + "\n\n", headersonly=True
        )
        patch.author = _decode_header(msg.get("From", "") or "")
        patch.date = _unfold(msg.get("Date", "") or "")
        patch.subject = _strip_subject(_decode_header(msg.get("Subject", "") or ""))
        body_lines: list[str] = []
        for ln in body.splitlines():
            if ln == "---" or ln.startswith(("diff --git ", "Index: ")):
                break
            body_lines.append(ln)
        patch.message = "\n".join(body_lines).strip("\n")
        patch.fields = parse_dep3(patch.message)
    files, end = _parse_diff(lines, first_diff)
    patch.files = files
    patch.diff = "".join(lines[first_diff:end])
    return patch


def read_patch(path: Path, name: str | None = None) -> Patch:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{path}: not UTF-8 ({exc})") from None
    return parse_patch(name or path.name, text)


def read_series_names(series_file: Path) -> list[str]:
    if not series_file.exists():
        return []
    names = []
    for raw in series_file.read_text(encoding="utf-8").splitlines():
        entry = raw.split("#", 1)[0].strip()
        if entry:
            names.append(entry.split()[0])
    return names


def load_series(layout: Layout = DEFAULT) -> Series:
    """Read the series; problems (missing files, ...) are collected, not raised."""
    names = read_series_names(layout.series_file)
    patches: dict[str, Patch] = {}
    problems: list[str] = []
    for name in names:
        path = layout.patches / name
        if not path.is_file():
            problems.append(f"patches/series lists {name}, but patches/{name} does not exist")
            continue
        patches[name] = read_patch(path)
    resolutions: dict[tuple[str, str], Patch] = {}
    if layout.resolutions.is_dir():
        for line_dir in sorted(p for p in layout.resolutions.iterdir() if p.is_dir()):
            for res in sorted(p for p in line_dir.iterdir() if p.is_file()):
                resolutions[(line_dir.name, res.name)] = read_patch(res)
    return Series(layout, names, patches, resolutions, problems)


ORIGIN_RE = r"^(upstream|backport|other), https?://\S+( \(.+\))?$"


def applied_line(value: str) -> tuple[int, int] | None:
    """The release line an ``Applied-Upstream:`` value names ("3.4.0b2" -> (3, 4)), None for "no"."""
    m = re.match(r"^(\d+)\.(\d+)(\.\d+)?([abrc]+\d+)?$", value.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _line_key(name: str) -> tuple[int, int]:
    major, minor = name.split(".")[:2]
    return int(major), int(minor)


def check_applied_upstream(series: Series, statuses: dict[str, list[str]]) -> list[str]:
    """``Applied-Upstream:`` against the engine: a line at or after the named release must show the
    patch ``upstream`` (its base carries it), and no other line may. ``statuses``: line -> per patch."""
    errors = []
    for i, name in enumerate(series.names):
        p = series.patches.get(name)
        if p is None:
            continue
        named = applied_line(p.field("Applied-Upstream") or "no")
        for line, per_patch in sorted(statuses.items()):
            if i >= len(per_patch):
                continue
            carries = per_patch[i] == "upstream"
            claims = named is not None and _line_key(line) >= named
            if carries and not claims:
                errors.append(
                    f"patches/{name}: the {line} line's base already carries it (engine: upstream), "
                    f"but Applied-Upstream says {p.field('Applied-Upstream')!r}"
                )
            elif claims and not carries:
                errors.append(
                    f"patches/{name}: Applied-Upstream {p.field('Applied-Upstream')!r} covers the {line} "
                    f"line, but the engine does not find it in that line's base (status {per_patch[i]})"
                )
    for i, name in enumerate(series.names):
        p = series.patches.get(name)
        for field_name in ("PR-Folds", "PR-Stack-On"):
            value = p.field(field_name) if p else None
            for number in re.findall(r"\d{4}", value or ""):
                earlier = [n for n in series.names[:i] if n.startswith(number + "-")]
                if not earlier:
                    errors.append(f"patches/{name}: {field_name} names {number}, not an earlier patch")
    return errors


def check_fields(p: Patch) -> list[str]:
    """The header problems of one patch (required fields, their forms, full blob ids)."""
    errors = []
    where = f"patches/{p.name}"
    if not p.subject:
        errors.append(f"{where}: missing required header Subject")
    if not p.author:
        errors.append(f"{where}: missing required header From")
    for name in REQUIRED_FIELDS:
        if not p.field(name):
            errors.append(f"{where}: missing required header {name} (DEP-3 block, last paragraph)")
    origin = p.field("Origin")
    kind = origin.split(",", 1)[0].strip() if origin else ""
    if origin and origin != "vendor" and not re.match(ORIGIN_RE, origin):
        errors.append(f"{where}: Origin must be 'vendor' or 'upstream|backport|other, <url>', not {origin!r}")
    forwarded = p.field("Forwarded")
    if forwarded and forwarded not in ("no", "not-needed") and not _URL_RE.match(forwarded):
        errors.append(f"{where}: Forwarded must be a URL, 'no' or 'not-needed', not {forwarded!r}")
    if kind == "vendor" and forwarded == "not-needed":
        errors.append(f"{where}: a vendor patch is ours: Forwarded must be its upstream PR URL or 'no'")
    applied = p.field("Applied-Upstream")
    # DEP-3: upstream and backport mean the code is upstream's as merged, so a release carries it.
    if kind in ("upstream", "backport") and applied and applied_line(applied) is None:
        errors.append(
            f"{where}: Origin {kind} means upstream merged it: Applied-Upstream must name the release "
            f"that carries it, not {applied!r}"
        )
    for field_name in ("PR-Folds", "PR-Stack-On"):
        value = p.field(field_name)
        if value and not re.fullmatch(r"\d{4}(, *\d{4})*", value):
            errors.append(f"{where}: {field_name} must list patch numbers like '0004, 0005', not {value!r}")
    last_update = p.field("Last-Update")
    if last_update:
        try:
            date.fromisoformat(last_update)
        except ValueError:
            errors.append(f"{where}: Last-Update must be YYYY-MM-DD, not {last_update!r}")
    if not p.files:
        errors.append(f"{where}: contains no diff")
    elif not p.full_index:
        errors.append(f"{where}: no full blob ids (export with git format-patch --full-index)")
    return errors


def check_authors(series: Series, identity: str = SERIES_AUTHOR) -> list[str]:
    """One identity for the series' own patches: every ``Origin: vendor`` patch is by ``identity``
    and no other patch is (theirs keep their real authors); a resolution is by its patch's author."""
    errors = []
    fix = "git commit --amend --author={a!r} in a checkout, then refresh"
    for p in series.ordered():
        vendor = (p.field("Origin") or "").strip() == "vendor"
        if vendor and p.author and p.author != identity:
            errors.append(
                f"patches/{p.name}: Origin vendor, so From must be the series' identity {identity!r}, "
                f"not {p.author!r} ({fix.format(a=identity)})"
            )
        elif not vendor and p.author == identity:
            errors.append(
                f"patches/{p.name}: From is the series' identity but Origin is "
                f"{p.field('Origin')!r}: keep the real author of upstream and seed patches"
            )
    for (line_name, name), res in sorted(series.resolutions.items()):
        patch = series.patches.get(name)
        if patch is not None and res.author and patch.author and res.author != patch.author:
            errors.append(
                f"patches/resolutions/{line_name}/{name}: From {res.author!r}, but the patch it resolves "
                f"is by {patch.author!r} (record it again with python -m tools refresh --line {line_name})"
            )
    return errors


def _marker_names(text: str) -> list[tuple[int, str]]:
    """(offset, patch name) per ``fixed_by(...)``: a string literal, or a module-level
    ``NAME = "..."`` constant of the same source."""
    found = []
    for m in _FIXED_BY_RE.finditer(text):
        name = m.group(1)
        if name is None:
            const = re.search(rf"""^{m.group(2)}\s*(?::[^=\n]*)?=\s*["']([^"']+)["']""", text, re.M)
            name = const.group(1) if const else f"<unresolved {m.group(2)}>"
        found.append((m.start(), name))
    return found


def fixed_by_markers(layout: Layout, series: Series) -> list[tuple[str, int, str]]:
    """(where, line number, patch name) of every ``fixed_by(...)`` in the test sources."""
    found: list[tuple[str, int, str]] = []
    for tests_dir in (layout.root / f.tests_dir for f in pins.UPSTREAM_FILES):
        for path in sorted(tests_dir.rglob("*.py")) if tests_dir.is_dir() else []:
            text = path.read_text(encoding="utf-8", errors="replace")
            for offset, name in _marker_names(text):
                found.append((layout.rel(path), text.count("\n", 0, offset) + 1, name))
    repo_tests = tuple(f.repo_tests_dir + "/" for f in pins.UPSTREAM_FILES)
    for p in series.ordered():
        for f in p.files:
            if not f.path.startswith(repo_tests):
                continue
            added = "\n".join(
                ln[1:]
                for ln in _file_section(p.diff, f.path).splitlines()
                if ln.startswith("+") and not ln.startswith("+++")
            )
            found.extend((f"patches/{p.name} ({f.path})", 0, name) for _, name in _marker_names(added))
    return found


def _file_section(diff: str, path: str) -> str:
    parts = re.split(r"^(?=diff --git )", diff, flags=re.M)
    return "".join(
        part for part in parts if part.startswith(f"diff --git a/{path} ") or f" b/{path}\n" in part[:400]
    )


def unreviewed(diff: str) -> list[str]:
    """The lines a diff adds that are a port's marks (``# PORT:``) or conflict markers, stripped."""
    return [ln[1:].strip() for ln in diff.splitlines() if _UNREVIEWED_RE.match(ln)]

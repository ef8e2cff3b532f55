"""Commit messages as Airflow sees them: the DEP-3 block split off, the PR number in the title.

A patch's commit message ends with a DEP-3 paragraph (``Origin:``, ``Bug:``, ...; see
CONTRIBUTING.md). Upstream commits carry none of it: the PR number is appended to the title
by GitHub's squash merge (``Title (#12345)``) and the issue goes into the PR body
(``closes: #N``). The backport and PR tools both derive their messages from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEP3_KEYS = frozenset(
    {
        "description",
        "subject",
        "origin",
        "bug",
        "forwarded",
        "applied-upstream",
        "last-update",
        "author",
        "from",
        "reviewed-by",
        "acked-by",
        "significant",
        "upstream-commit",
        "pr-folds",
        "pr-stack-on",
        "regression-test",
    }
)
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$")
_PR_URL = re.compile(r"github\.com/apache/airflow/pull/(\d+)")
_ISSUE_URL = re.compile(r"github\.com/apache/airflow/issues/(\d+)")
_TITLE_PR = re.compile(r"\(#\d+\)\s*$")


def _is_dep3_key(key: str) -> bool:
    key = key.lower()
    return key in DEP3_KEYS or key.startswith("bug-")


@dataclass
class Message:
    """A commit message with its DEP-3 fields parsed out (multi-valued: ``Bug`` may repeat)."""

    title: str
    body: str  # without the DEP-3 lines; may be empty
    fields: dict[str, list[str]] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        values = self.fields.get(key.lower())
        return values[0] if values else None

    def all(self, key: str) -> list[str]:
        return list(self.fields.get(key.lower(), []))

    @property
    def pr_number(self) -> int | None:
        """The upstream PR of ``Origin: upstream, <url>`` (or ``Forwarded: <url>``), if any."""
        for key in ("origin", "forwarded"):
            for value in self.all(key):
                if m := _PR_URL.search(value):
                    return int(m.group(1))
        return None

    @property
    def significant(self) -> bool:
        return (self.get("significant") or "").strip().lower() in ("yes", "true")

    def backport_note(self) -> str:
        """``(backported from apache/airflow#N)`` from ``Origin: backport, <PR url>`` (or its URL)."""
        for value in self.all("origin"):
            if m := _PR_URL.search(value):
                return f"(backported from apache/airflow#{m.group(1)})"
            if url := re.search(r"https?://\S+", value):
                return f"(backported from {url.group(0).rstrip(',.;')})"
        return "(backported from upstream)"

    def upstream_title(self) -> str:
        """The title as it reads on Airflow's main after a squash merge: ``Title (#PR)``."""
        pr = self.pr_number
        if pr is None or _TITLE_PR.search(self.title):
            return self.title
        return f"{self.title} (#{pr})"

    def upstream_message(self) -> str:
        """Title (with PR number) and body, no DEP-3 lines; ends with one newline."""
        text = self.upstream_title()
        if self.body:
            text += "\n\n" + self.body
        return text + "\n"


def parse(message: str) -> Message:
    """Split a commit message (``git log --format=%B``) into title, body and DEP-3 fields."""
    text = message.strip("\n")
    title, _, rest = text.partition("\n")
    paragraphs = re.split(r"\n[ \t]*\n", rest.strip("\n")) if rest.strip() else []
    fields: dict[str, list[str]] = {}
    if paragraphs:
        last = paragraphs[-1].splitlines()
        parsed = [_FIELD.match(line) for line in last]
        is_block = (
            all(m or line[:1] in (" ", "\t") for m, line in zip(parsed, last, strict=True))
            and parsed[0] is not None
        )
        if is_block and any(m and _is_dep3_key(m.group(1)) for m in parsed):
            kept: list[str] = []
            current: str | None = None
            for m, line in zip(parsed, last, strict=True):
                if m:
                    current = m.group(1).lower()
                    if _is_dep3_key(current):
                        fields.setdefault(current, []).append(m.group(2).strip())
                        continue
                    kept.append(line)
                elif current is not None and _is_dep3_key(current):
                    fields[current][-1] = (fields[current][-1] + " " + line.strip()).strip()
                else:
                    kept.append(line)
            paragraphs = paragraphs[:-1] + (["\n".join(kept)] if kept else [])
    body = "\n\n".join(p.strip("\n") for p in paragraphs).strip("\n")
    return Message(title=title.strip(), body=body, fields=fields)


def issue_refs(value: str) -> str | None:
    """``#N`` for an apache/airflow issue or PR URL, the URL itself for anything else."""
    for rx in (_ISSUE_URL, _PR_URL):
        if m := rx.search(value):
            return f"#{m.group(1)}"
    value = value.strip()
    return value or None

"""Towncrier fragments: ``newsfragments/<id>.<type>.(md|rst)``, a known type, not empty."""

from __future__ import annotations

import argparse
import re

from tools.shared.layout import DEFAULT, Layout

ALLOWED_EXTRA = {".gitignore", ".gitkeep", "README.md", "README.rst"}
_NAME_RE = re.compile(r"^(?P<id>[A-Za-z0-9][A-Za-z0-9_-]*)\.(?P<type>[a-z]+)(?:\.\d+)?\.(?:md|rst)$")


def fragment_types(layout: Layout = DEFAULT) -> list[str]:
    """The ``directory`` of every ``[[tool.towncrier.type]]`` in pyproject.toml."""
    text = (layout.root / "pyproject.toml").read_text(encoding="utf-8")
    types = []
    for block in re.split(r"^\[\[tool\.towncrier\.type\]\]\s*$", text, flags=re.M)[1:]:
        block = re.split(r"^\[", block, maxsplit=1, flags=re.M)[0]
        if m := re.search(r'^directory\s*=\s*"([^"]+)"', block, re.M):
            types.append(m.group(1))
    return types


def check_fragments(layout: Layout = DEFAULT) -> list[str]:
    """One line per malformed fragment; empty when every fragment is well formed."""
    directory = layout.root / "newsfragments"
    types = fragment_types(layout)
    errors: list[str] = []
    if not directory.is_dir():
        return errors
    for path in sorted(directory.iterdir()):
        if path.name in ALLOWED_EXTRA:
            continue
        where = f"newsfragments/{path.name}"
        m = _NAME_RE.match(path.name)
        if path.is_dir() or not m:
            errors.append(f"{where}: expected <id>.<type>.md or <id>.<type>.rst")
        elif m.group("type") not in types:
            errors.append(f"{where}: unknown type {m.group('type')!r} (known: {', '.join(types)})")
        elif not path.read_text(encoding="utf-8", errors="replace").strip():
            errors.append(f"{where}: empty")
    return errors


def _cmd_check(args: argparse.Namespace) -> int:
    errors = check_fragments()
    for e in errors:
        print(e)
    print(f"newsfragments: {len(errors)} problem(s)" if errors else "newsfragments: ok")
    return 1 if errors else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check-newsfragments", help="check newsfragments/ file names and contents")
    p.set_defaults(func=_cmd_check)

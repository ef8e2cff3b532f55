"""The tests session's results on a line's final overlay, kept for verify to reuse.

``nox -s tests`` runs every test of ``tests/executor`` on the final overlay of each line; the
final stage of ``nox -s verify`` would run the ``fixed_by`` ones again on the same code. So the
tests session records its outcomes (through ``tools.engine.fixed_by_plugin``) next to a fingerprint of
what it ran: the overlay's files and every derived test file. Verify takes a passing
outcome from that record only if the fingerprint still matches the final stage it is about to
run; anything else (another code, another test, a test that did not pass) runs again.

Standard library only: the noxfile imports it before any install.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from tools.shared import pins
from tools.shared.layout import DEFAULT, Layout


def record_path(line: str, layout: Layout = DEFAULT) -> Path:
    return layout.build / "verify" / line / "final-from-tests.json"


def fingerprint_path(line: str, layout: Layout = DEFAULT) -> Path:
    return layout.build / "verify" / line / "final-from-tests.fingerprint"


def _test_dirs(layout: Layout) -> list[Path]:
    return [layout.root / f.tests_dir for f in pins.UPSTREAM_FILES]


def sources_digest(sources: Mapping[str, bytes]) -> bytes:
    """One value for a set of installed files (path -> bytes): what a stage puts into a venv."""
    digest = hashlib.sha256()
    for rel in sorted(sources):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(sources[rel]).digest())
    return digest.digest()


def fingerprint(sources: Mapping[str, bytes], layout: Layout = DEFAULT) -> str:
    """sha256 of the installed upstream files and every derived test file (by relative path)."""
    digest = hashlib.sha256(sources_digest(sources))
    for d in _test_dirs(layout):
        for path in sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(layout.root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def prepare(line: str, source: Mapping[str, bytes], layout: Layout = DEFAULT) -> Path:
    """Forget any earlier record of ``line``, note what is about to run; return where to record."""
    record = record_path(line, layout)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    fingerprint_path(line, layout).write_text(fingerprint(source, layout) + "\n")
    return record


def passed(line: str, source: Mapping[str, bytes], layout: Layout = DEFAULT) -> set[str]:
    """The tests that passed in the tests session on exactly ``source`` and today's tests; else none."""
    record, stamp = record_path(line, layout), fingerprint_path(line, layout)
    if not record.exists() or not stamp.exists():
        return set()
    if stamp.read_text().strip() != fingerprint(source, layout):
        return set()
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return set()
    return {nodeid for nodeid, rec in data.items() if isinstance(rec, dict) and rec.get("outcome") == "pass"}

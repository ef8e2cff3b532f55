"""The PR body's "How this was verified" section, generated from the verify and chaos JSON.

``build/verify.json`` (``nox -s verify``) has, per line, every ``fixed_by`` test's outcome on
every stage; the rows of the tests fixed by the PR's patches are shown as verify shows them.
``build/chaos/<line>.json`` (``nox -s chaos``) gives the soak figure of the PR's stage (else
the last stage it ran). A file that is absent or unreadable is said to be, never made up.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.shared import table

LABELS = {"pass": "pass", "flaky": "pass*", "fail": "FAIL", "error": "ERR", "skip": "skip", "missing": "-"}


def _load(path: Path) -> tuple[dict[str, Any] | None, str]:
    if not path.is_file():
        return None, "absent"
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        return None, f"unreadable ({exc})"
    return (data, "") if isinstance(data, dict) else (None, "unreadable (not an object)")


def verify_rows(data: dict[str, Any], patches: Sequence[str]) -> list[str]:
    """Verify's matrix rows (per line) of the tests fixed by ``patches``."""
    out: list[str] = []
    series = list(data.get("series", []))
    for line, entry in sorted(data.get("lines", {}).items()):
        tests = {n: t for n, t in entry.get("tests", {}).items() if t.get("fixed_by") in patches}
        if not tests:
            continue
        stages = [str(k) for k in entry.get("stages", [])]
        rows = [[f"{line} ({entry.get('version', '?')})", "fixed by", *stages]]
        for nodeid, t in sorted(tests.items()):
            fixed = str(t.get("fixed_by"))
            short = fixed.split("-", 1)[0]
            if fixed in series and t.get("introduced_by_stage"):
                short = f"{int(t['introduced_by_stage']):04d}>{short}"
            cells = [
                LABELS.get(str(cell.get("outcome")), "?") + ("!" if cell.get("unexpected") else "")
                for cell in (t.get("cells", {}).get(s, {}) for s in stages)
            ]
            rows.append([nodeid.removeprefix("tests/executor/"), short, *cells])
        out += [*table.render(rows, widths=[10, 8, *(5 for _ in stages)], strip=False), ""]
    return out[:-1] if out else out


def chaos_line(data: dict[str, Any], stage: int) -> str:
    stages = data.get("stages") or []
    if not stages:
        return "no stage recorded"
    chosen = next((s for s in stages if s.get("stage") == stage), stages[-1])
    faults = chosen.get("faults", {})
    note = "" if chosen.get("stage") == stage else f" (stage {stage} was not soaked; the last stage was)"
    return (
        f"stage {chosen.get('stage')}{note}: {chosen.get('runs')} seeded runs (seed {data.get('seed')}), "
        f"{sum(int(v) for v in faults.values())} faults injected, {chosen.get('hangs')} hangs, "
        f"{chosen.get('lost_keys')} lost keys, {chosen.get('misattributed_keys')} misattributed results, "
        f"{chosen.get('end_over_bound')} end() over its bound, {chosen.get('errors')} errors"
    )


def section(build: Path, patches: Sequence[str], line: str, stage: int, primary: str) -> str:
    """The whole section for a PR carrying ``patches`` (the last one's stage is ``stage``)."""
    lines = ["### How this was verified", ""]
    data, why = _load(build / "verify.json")
    if data is None:
        lines.append(f"- Verify matrix: `build/verify.json` is {why}; run `nox -s verify` to produce it.")
    else:
        rows = verify_rows(data, patches)
        if rows:
            lines.append(
                "- `nox -s verify`: each regression test of this PR fails on every stage before the patch "
                "that fixes it and passes from it on (stage k = the line's release + the first k patches; "
                "`!` = not as expected):"
            )
            lines += ["", "```", *rows, "```", ""]
        else:
            names = ", ".join(p.split("-", 1)[0] for p in patches)
            lines.append(f"- Verify matrix: `build/verify.json` has no test fixed by {names}.")
    for name in dict.fromkeys([line, primary]):
        chaos, why = _load(build / "chaos" / f"{name}.json")
        if chaos is not None:
            lines.append(
                f"- `nox -s chaos` on {name} ({chaos.get('version', '?')}): {chaos_line(chaos, stage)}."
            )
            break
    else:
        lines.append(
            f"- Chaos soak: `build/chaos/{line}.json` is absent; run `nox -s chaos -- --line {line}`."
        )
    return "\n".join(lines).rstrip() + "\n"

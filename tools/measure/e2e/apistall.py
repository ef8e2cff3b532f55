"""Issue 52's counts of one round: did the api-server stall, and what did it cost the tasks (pure).

From the api-server's access log (``request finished [http.access] method=... path=...
status_code=... duration_us=...``, Airflow's ``HttpAccessLogMiddleware``, 3.2 on; every request
but the health check, logged when it ends):

api >5s, longest
    requests that took ``SLOW_REQUEST_S`` or more inside the api-server, execution API and REST
    alike, and the longest of all (a ``ti_run`` held behind a full pool reads 30 s and more).
starts retried
    task instances whose start (``PATCH /execution/task-instances/{id}/run``) reached the
    api-server more than once: task-sdk's client gives a call ``[workers] execution_api_timeout``
    (5 s) and sends it again (up to 5 tries over about 31 s). Its retry line (tenacity's
    ``Starting call to 'airflow.sdk.api.client.Client.request', this is the 1st time calling it``,
    logged by the supervisor, so in the scheduler's log with LocalExecutor, after the try that
    failed) does not say which call it retries, so the access log is the count; the retry lines
    of every call are counted beside it (``client_retries``).

And from the driver:

left running
    task instances the API still lists as ``running`` at the end of the run while no process
    names them (``running_without_process``: neither the task process, titled
    ``airflow worker -- <ti id>`` by task-sdk, nor the LocalExecutor worker that holds it), twice,
    a few seconds apart: a start committed after the executor had already reported the task
    failed, which only the scheduler's heartbeat timeout (300 s) ends.

``rounds_table`` prints these with the UI poller's (``tools.measure.e2e.uipoll``) and the run's
tasks/s, failed tasks and pool timeouts: one row per round, the stages side by side.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.measure.e2e.uipoll import SLOW_REQUEST_S

ACCESS_EVENT = "request finished"
# tenacity's before_sleep line in task-sdk's client (airflow.sdk.api.client.Client.request, 1.1-1.4).
CLIENT_RETRY_TEXT = "Starting call to 'airflow.sdk.api.client.Client.request'"
ACCESS_LOGGER = "http.access"
_FIELD = re.compile(r"(\w+)=(\S*)")
TI_RUN = re.compile(r"^/execution/task-instances/([0-9a-fA-F-]{36})/run$")


@dataclass(frozen=True)
class Access:
    method: str
    path: str
    status: int
    seconds: float


def parse_access(line: str) -> Access | None:
    """One access-log line (console or JSON rendering) as an ``Access``; None for any other line."""
    if ACCESS_EVENT not in line:
        return None
    fields: dict[str, Any]
    if line.lstrip().startswith("{"):
        try:
            fields = json.loads(line)
        except ValueError:
            return None
        if fields.get("event") != ACCESS_EVENT:
            return None
    elif ACCESS_LOGGER in line:
        fields = dict(_FIELD.findall(line.split(ACCESS_EVENT, 1)[1]))
    else:
        return None
    try:
        return Access(
            str(fields["method"]),
            str(fields["path"]),
            int(fields["status_code"]),
            int(fields["duration_us"]) / 1e6,
        )
    except (KeyError, ValueError):
        return None


def access_records(text: str) -> list[Access]:
    return [a for a in map(parse_access, text.splitlines()) if a is not None]


@dataclass(frozen=True)
class ApiFigures:
    requests: int
    slow: int  # requests of SLOW_REQUEST_S or more
    longest_s: float | None
    longest_path: str | None
    server_errors: int  # answered 5xx
    starts: int  # PATCH .../run requests
    starts_retried: int  # task instances whose start came more than once
    start_repeats: int  # the starts beyond each task instance's first

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def api_figures(records: Iterable[Access]) -> ApiFigures:
    rs = list(records)
    longest = max(rs, key=lambda a: a.seconds, default=None)
    starts = Counter(
        m.group(1) for a in rs if a.method == "PATCH" and (m := TI_RUN.match(a.path)) is not None
    )
    return ApiFigures(
        requests=len(rs),
        slow=sum(1 for a in rs if a.seconds >= SLOW_REQUEST_S),
        longest_s=longest.seconds if longest else None,
        longest_path=longest.path if longest else None,
        server_errors=sum(1 for a in rs if a.status >= 500),
        starts=sum(starts.values()),
        starts_retried=sum(1 for n in starts.values() if n > 1),
        start_repeats=sum(n - 1 for n in starts.values()),
    )


def api_log_figures(*logs: Path) -> ApiFigures | None:
    """The access logs' figures, every api-server's together (None: no log)."""
    texts: list[str | None] = []
    for log in logs:
        try:
            texts.append(log.read_text(errors="replace"))
        except OSError:
            texts.append(None)
    return api_text_figures(*texts)


def api_text_figures(*texts: str | None) -> ApiFigures | None:
    """``api_log_figures`` of logs already read (a None text: that log is missing)."""
    found = [text for text in texts if text is not None]
    return api_figures([r for text in found for r in access_records(text)]) if found else None


def client_retries(log: Path) -> int | None:
    """How many times task-sdk's client retried a call (any call), from the log its supervisors
    write to (None: no log)."""
    try:
        return log.read_text(errors="replace").count(CLIENT_RETRY_TEXT)
    except OSError:
        return None


def running_without_process(tis: Iterable[dict[str, Any]], titles: Iterable[str]) -> list[str]:
    """Ids of the task instances in state ``running`` that no process title names."""
    names = list(titles)
    return sorted(
        str(d["id"])
        for d in tis
        if d.get("state") == "running" and d.get("id") and not any(str(d["id"]) in t for t in names)
    )


# -- one row per round ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundCounts:
    """What one round's report holds for the table (None: not measured)."""

    tasks_per_s: float | None = None
    api_slow: int | None = None
    api_longest_s: float | None = None
    poll_longest_s: float | None = None
    poll_errors: int | None = None  # the poller's 5xx answers and unanswered requests
    pool_timeouts: int | None = None  # the api-server log's (throughput.count_pool_timeouts)
    starts_retried: int | None = None
    failed: int | None = None
    left_running: int | None = None
    load: float | None = None  # the machine's 1-minute load average as the run ended
    passed: bool = True  # the scenario's verdict, which the report keeps beside the counts

    def as_json(self) -> dict[str, Any]:
        return {
            k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items() if k != "passed"
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoundCounts:
        known: dict[str, Any] = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def _n(v: float | int | None, digits: int = 0, unit: str = "") -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


_COLUMNS: tuple[tuple[str, int, Callable[[RoundCounts], str]], ...] = (  # header, width, cell
    ("run", 5, lambda c: "ok" if c.passed else "FAIL"),
    ("tasks/s", 8, lambda c: _n(c.tasks_per_s, 2)),
    ("load", 6, lambda c: _n(c.load, 1)),
    (">5s", 5, lambda c: _n(c.api_slow)),
    ("longest", 8, lambda c: _n(c.api_longest_s, 1, "s")),
    ("poll", 7, lambda c: _n(c.poll_longest_s, 1, "s")),
    ("5xx", 4, lambda c: _n(c.poll_errors)),
    ("t/o", 4, lambda c: _n(c.pool_timeouts)),
    ("retried", 8, lambda c: _n(c.starts_retried)),
    ("failed", 7, lambda c: _n(c.failed)),
    ("left", 5, lambda c: _n(c.left_running)),
)
_STAGE_WIDTH = sum(w for _, w, _ in _COLUMNS) + 3


def rounds_table(stages: Sequence[tuple[str, Sequence[RoundCounts | None]]], title: str) -> str:
    """Per round, each stage's counts side by side (a round a stage did not reach: blank)."""
    rounds = max((len(runs) for _, runs in stages), default=0)
    head1 = f"{'round':<6}" + "".join(f" | {label:<{_STAGE_WIDTH - 3}}" for label, _ in stages)
    head2 = f"{'':<6}" + "".join(" | " + "".join(f"{h:>{w}}" for h, w, _ in _COLUMNS) for _ in stages)
    out = [title, head1.rstrip(), head2]
    for i in range(rounds):
        row = f"{i + 1:<6}"
        for _, runs in stages:
            c = runs[i] if i < len(runs) else None
            if c is None:
                row += " | " + " " * (_STAGE_WIDTH - 3)
                continue
            cells = "".join(f"{cell(c):>{w}}" for _, w, cell in _COLUMNS)
            row += " | " + cells
        out.append(row.rstrip(" |"))
    legend = (
        "run: the scenario's verdict; tasks/s of the round; load: the machine's 1-minute load average as "
        "the run ended; >5s, longest: api-server requests "
        f"(access log) of {SLOW_REQUEST_S:g} s or more, the longest; poll: the UI poller's longest "
        "request; 5xx: its 5xx answers and unanswered requests; t/o: pool timeouts (api-server log); "
        "retried: task starts sent more than once; failed: tasks failed; left: task instances left "
        "running with no process"
    )
    out += textwrap.wrap(legend, 110)
    return "\n".join(out)

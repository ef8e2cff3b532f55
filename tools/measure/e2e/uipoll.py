"""A UI's run page, open while the run goes: the REST requests an operator watching it makes.

Airflow's UI (3.3's ``airflow/ui/dist``, react-query) refetches each query on a DAG run's page
every ``[api] auto_refresh_interval`` seconds (3 by default) while the run or its task instances
are not final, each query on its own timer, a tick skipped while its last request is still in
flight, over the browser's parallel connections. Of those queries the poller sends the four that
read the run, one thread each (``ENDPOINTS``): the run (``getDagRun``), the task instance table's
first page (``getTaskInstances``, the API's default page size), and the grid's runs and task
instance summaries (``getGridRuns``, ``getGridTiSummariesStream``).

Its token is the one the UI gets: SimpleAuthManager's login (``GET /auth/token/login``, all-admins
in the e2e stack) sets it as the ``_token`` cookie; the poller sends it as a bearer token, which is
how the api-server resolves the user either way (``get_user_from_token``, and from 3.2 on its
revoked-token check, a database query). Where that login gives no cookie, ``GET /auth/token``'s
``access_token``; with neither, no token.

Each request becomes a ``PollRecord`` (start on the driver's clock, seconds, HTTP status or None
when no answer came within ``CLIENT_TIMEOUT``). The client waits longer than SQLAlchemy's 30 s
``pool_timeout``, as a browser would, so a stalled api-server shows as a 30 s request rather than a
client timeout. ``summarise`` turns the records into the round's counts (pure, tested on recorded
histories).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Airflow's [api] auto_refresh_interval default (config.yml, 3.1-3.4), the UI's refetch interval.
UI_REFRESH_INTERVAL = 3.0
# A request slower than this counts as slow: task-sdk's client gives a call [workers]
# execution_api_timeout (5 s) before it retries, and a UI user sees the page hang.
SLOW_REQUEST_S = 5.0
CLIENT_TIMEOUT = 60.0  # longer than pool_timeout (30 s): the stall is measured, not cut
POOL_TIMEOUT_TEXT = "QueuePool limit of size"
TOKEN_COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN
RECORDS_FILE = "ui-poll.jsonl"  # in the scenario's home


@dataclass(frozen=True)
class Endpoint:
    name: str  # the UI's service call
    path: str  # with {dag_id} and {run_id} to fill in, quoted


ENDPOINTS = (
    Endpoint("getDagRun", "/api/v2/dags/{dag_id}/dagRuns/{run_id}"),
    Endpoint("getTaskInstances", "/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"),
    Endpoint("getGridRuns", "/ui/grid/runs/{dag_id}"),
    Endpoint("getGridTiSummariesStream", "/ui/grid/ti_summaries/{dag_id}?run_ids={run_id}"),
)


@dataclass(frozen=True)
class PollRecord:
    t: float  # when the request was sent, on the poller's clock (seconds since the trigger)
    endpoint: str
    seconds: float
    status: int | None  # None: no answer (timeout, connection refused or reset)
    detail: str = ""  # a 5xx answer's body (its start), or the error without an answer

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PollRecord:
        return cls(
            float(d["t"]), str(d["endpoint"]), float(d["seconds"]), d.get("status"), d.get("detail", "")
        )


@dataclass(frozen=True)
class PollFigures:
    requests: int
    slow: int  # requests of SLOW_REQUEST_S or more (an unanswered one too)
    longest_s: float | None
    longest_endpoint: str | None
    server_errors: int  # 5xx answers
    pool_timeouts: int  # of those, bodies naming SQLAlchemy's QueuePool timeout
    no_answer: int
    token: str = ""  # how the poller authenticated

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def text(self) -> str:
        longest = "-" if self.longest_s is None else f"{self.longest_s:.1f} s ({self.longest_endpoint})"
        return (
            f"UI poller: {self.requests} requests, {self.slow} of {SLOW_REQUEST_S:g} s or more, "
            f"longest {longest}, {self.server_errors} answered 5xx ({self.pool_timeouts} pool timeouts), "
            f"{self.no_answer} unanswered; token {self.token or 'none'}"
        )


def summarise(records: Iterable[PollRecord], token: str = "") -> PollFigures:
    """The round's counts from the poller's records."""
    rs = list(records)
    longest = max(rs, key=lambda r: r.seconds, default=None)
    errors = [r for r in rs if r.status is not None and r.status >= 500]
    return PollFigures(
        requests=len(rs),
        slow=sum(1 for r in rs if r.seconds >= SLOW_REQUEST_S),
        longest_s=longest.seconds if longest else None,
        longest_endpoint=longest.endpoint if longest else None,
        server_errors=len(errors),
        pool_timeouts=sum(1 for r in errors if POOL_TIMEOUT_TEXT in r.detail),
        no_answer=sum(1 for r in rs if r.status is None),
        token=token,
    )


def write_records(path: Path, records: Iterable[PollRecord]) -> None:
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in records))


def read_records(path: Path) -> list[PollRecord]:
    """A poller's records as ``write_records`` left them (empty when there is no file)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [PollRecord.from_json(json.loads(ln)) for ln in lines if ln.strip()]


# -- the HTTP side ----------------------------------------------------------------------------------


# why not web.call (urllib): the login answers 307 with the token in its Set-Cookie, which urllib
# would follow and lose, and every status is a record here, not an exception to catch.
def _request(
    host: str, port: int, path: str, token: str | None, timeout: float
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def _cookie(headers: dict[str, str], name: str) -> str | None:
    # http.client joins several Set-Cookie headers with ", "; a JWT has no comma or semicolon.
    for part in headers.get("set-cookie", "").replace(",", ";").split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name and value:
            return value
    return None


class UiPoller:
    """Polls ``ENDPOINTS`` of one run, one thread each, from ``start()`` until ``stop()``."""

    def __init__(
        self,
        base: str,
        dag_id: str,
        run_id: str,
        clock: Callable[[], float],
        interval: float = UI_REFRESH_INTERVAL,
        endpoints: Sequence[Endpoint] = ENDPOINTS,
        timeout: float = CLIENT_TIMEOUT,
    ):
        url = urllib.parse.urlsplit(base)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 80
        q = urllib.parse.quote
        self.paths = [
            (e.name, e.path.format(dag_id=q(dag_id, safe=""), run_id=q(run_id, safe=""))) for e in endpoints
        ]
        self.clock = clock
        self.interval = interval
        self.timeout = timeout
        self.token: str | None = None
        self.token_source = ""
        self.records: list[PollRecord] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def login(self) -> None:
        """Get the token as the UI does (the login's cookie), else the all-admins token endpoint."""
        try:
            _, headers, _ = _request(self.host, self.port, "/auth/token/login", None, self.timeout)
            self.token = _cookie(headers, TOKEN_COOKIE)
            if self.token:
                self.token_source = f"{TOKEN_COOKIE} cookie of GET /auth/token/login"
                return
            status, _, body = _request(self.host, self.port, "/auth/token", None, self.timeout)
            if status < 300:
                self.token = str(json.loads(body)["access_token"])
                self.token_source = "GET /auth/token"
        except (OSError, ValueError, KeyError):
            self.token = None

    def start(self) -> None:
        if self.token is None:
            self.login()
        for name, path in self.paths:
            th = threading.Thread(target=self._loop, args=(name, path), name=f"uipoll-{name}", daemon=True)
            th.start()
            self._threads.append(th)

    def _loop(self, name: str, path: str) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            t = self.clock()
            t0 = time.monotonic()
            try:
                status, _, body = _request(self.host, self.port, path, self.token, self.timeout)
                record = PollRecord(
                    t,
                    name,
                    time.monotonic() - t0,
                    status,
                    body[:300].decode(errors="replace") if status >= 500 else "",
                )
            except (OSError, http.client.HTTPException) as e:
                record = PollRecord(t, name, time.monotonic() - t0, None, f"{type(e).__name__}: {e}"[:300])
            with self._lock:
                self.records.append(record)
            # react-query's interval: the next tick on the grid; a tick that came while in flight is skipped
            now = time.monotonic()
            next_tick += self.interval
            if next_tick < now:
                next_tick += self.interval * ((now - next_tick) // self.interval + 1)
            self._stop.wait(next_tick - now)

    def stop(self) -> list[PollRecord]:
        """Stop polling; waits for requests in flight (up to the client timeout). Returns the records."""
        self._stop.set()
        deadline = time.monotonic() + self.timeout + 5
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return sorted(self.records, key=lambda r: r.t)

    def figures(self) -> PollFigures:
        with self._lock:
            return summarise(self.records, self.token_source)

"""Watch one DAG run through Airflow's REST API until it is final or its deadline passes.

The watcher only reads: ``GET /api/v2/dags/{dag}/dagRuns/{run}`` and its task instances, every
``interval`` seconds. It records each state a task instance is seen in (first sighting, per try)
so a run that never finishes still leaves a record of where each task stopped. The API and the
clock are injected, so tests drive it with fakes.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from tools.measure.e2e import web

Json = dict[str, Any]

FINAL_RUN_STATES = frozenset({"success", "failed"})
PAGE = 1000  # task instances asked for per request


class Api(Protocol):
    def run(self, dag_id: str, run_id: str) -> Json: ...

    def task_instances(self, dag_id: str, run_id: str) -> list[Json]: ...

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[Json]: ...


class RestApi:
    """The few REST calls the e2e session needs (the stack runs with all-admins auth)."""

    def __init__(self, base: str, timeout: float = 10.0):
        self.base = base.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None

    def get(self, path: str, timeout: float | None = None) -> Json:
        try:
            return self._get(path, timeout)
        except urllib.error.HTTPError as e:
            if e.code != 401:
                raise
        # why: from 3.2 on all-admins lets a request without a token in; 3.1 answers 401 and
        # hands out an all-admins token at GET /auth/token instead (a new one if it expired).
        self._token = str(self._get("/auth/token", timeout)["access_token"])
        return self._get(path, timeout)

    def _get(self, path: str, timeout: float | None) -> Json:
        auth = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        return cast(Json, web.call(self.base + path, headers=auth, timeout=timeout or self.timeout))

    def _run_path(self, dag_id: str, run_id: str) -> str:
        q = urllib.parse.quote
        return f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id, safe='')}"

    def run(self, dag_id: str, run_id: str) -> Json:
        return self.get(self._run_path(dag_id, run_id))

    def task_instances(self, dag_id: str, run_id: str) -> list[Json]:
        """Every task instance of the run, page by page (the api-server caps a page's size at its
        ``[api] maximum_page_limit``, 100 by default, whatever ``limit`` asks for)."""
        out: list[Json] = []
        while True:
            page = self.get(self._run_path(dag_id, run_id) + f"/taskInstances?limit={PAGE}&offset={len(out)}")
            tis = cast(list[Json], page["task_instances"])
            out += tis
            if not tis or len(out) >= int(page.get("total_entries", len(out))):
                return out

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[Json]:
        path = self._run_path(dag_id, run_id) + f"/taskInstances/{urllib.parse.quote(task_id)}/tries"
        return cast(list[Json], self.get(path)["task_instances"])

    def health(self) -> Json | None:
        try:
            return self.get("/api/v2/monitor/health")
        except (OSError, ValueError):
            return None


@dataclass(frozen=True)
class TaskSnap:
    task_id: str
    ti_id: str
    state: str | None
    try_number: int
    queued_when: str | None = None
    start_date: str | None = None
    end_date: str | None = None
    pid: int | None = None

    @classmethod
    def from_api(cls, d: Json) -> TaskSnap:
        return cls(
            task_id=d["task_id"],
            ti_id=d.get("id", ""),
            state=d.get("state"),
            try_number=int(d.get("try_number") or 0),
            queued_when=d.get("queued_when"),
            start_date=d.get("start_date"),
            end_date=d.get("end_date"),
            pid=d.get("pid"),
        )


@dataclass(frozen=True)
class Snapshot:
    t: float  # seconds since the watch began
    run_state: str | None
    tasks: dict[str, TaskSnap]

    def count(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ts in self.tasks.values():
            key = ts.state or "none"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def by_ti_id(self, ti_id: str) -> TaskSnap | None:
        return next((ts for ts in self.tasks.values() if ts.ti_id == ti_id), None)


@dataclass(frozen=True)
class Transition:
    t: float
    task_id: str
    try_number: int
    state: str | None


@dataclass
class WatchResult:
    final: bool
    run_state: str | None
    elapsed: float  # seconds from the watch's start to the final state, or to giving up
    last: Snapshot | None
    transitions: list[Transition]
    api_errors: int


@dataclass
class RunWatcher:
    """Polls one run; ``watch()`` returns when it is final, at the deadline, or when stopped."""

    api: Api
    dag_id: str
    run_id: str
    interval: float = 0.5
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    t0: float | None = None
    last: Snapshot | None = None
    transitions: list[Transition] = field(default_factory=list)
    api_errors: int = 0
    _seen: dict[tuple[str, int], str | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start_clock(self, t0: float | None = None) -> None:
        self.t0 = self.clock() if t0 is None else t0

    def now(self) -> float:
        assert self.t0 is not None, "start_clock() first"
        return self.clock() - self.t0

    def poll_once(self) -> Snapshot | None:
        """One look at the run; None (and an error counted) when the API did not answer."""
        try:
            run = self.api.run(self.dag_id, self.run_id)
            tis = self.api.task_instances(self.dag_id, self.run_id)
        except (OSError, ValueError, KeyError):
            # The run may not exist yet just after the trigger, or the api-server is busy.
            self.api_errors += 1
            return None
        t = self.now()
        snap = Snapshot(t, run.get("state"), {d["task_id"]: TaskSnap.from_api(d) for d in tis})
        with self._lock:
            for ts in snap.tasks.values():
                key = (ts.task_id, ts.try_number)
                if key not in self._seen or self._seen[key] != ts.state:
                    self._seen[key] = ts.state
                    self.transitions.append(Transition(t, ts.task_id, ts.try_number, ts.state))
            self.last = snap
        return snap

    def watch(self, deadline: float, stop: threading.Event | None = None) -> WatchResult:
        """Poll until the run is final or ``deadline`` seconds (on this watcher's clock) passed."""
        if self.t0 is None:
            self.start_clock()
        while True:
            snap = self.poll_once()
            if snap is not None and snap.run_state in FINAL_RUN_STATES:
                return self._result(True, snap.t)
            if self.now() >= deadline or (stop is not None and stop.is_set()):
                return self._result(False, self.now())
            self.sleep(self.interval)

    def _result(self, final: bool, elapsed: float) -> WatchResult:
        with self._lock:
            last = self.last
            return WatchResult(
                final=final,
                run_state=last.run_state if last else None,
                elapsed=elapsed,
                last=last,
                transitions=list(self.transitions),
                api_errors=self.api_errors,
            )

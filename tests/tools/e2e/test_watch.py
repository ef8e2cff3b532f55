"""The run watcher against a fake API and clock: polling, transitions, the deadline."""

from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

from tools.measure.e2e import soak
from tools.measure.e2e.watch import Json, RestApi, RunWatcher, Transition


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeApi:
    """Replays a list of (run_state, {task_id: (state, try)}) frames, one per poll."""

    def __init__(self, frames: list[object]) -> None:
        self.frames = frames
        self.i = 0

    def _frame(self) -> tuple[str, dict[str, tuple[str, int]]]:
        frame = self.frames[min(self.i, len(self.frames) - 1)]
        if isinstance(frame, Exception):
            raise frame
        return frame  # type: ignore[return-value]

    def run(self, dag_id: str, run_id: str) -> Json:
        try:
            return {"state": self._frame()[0]}
        except Exception:
            self.i += 1
            raise

    def task_instances(self, dag_id: str, run_id: str) -> list[Json]:
        _, tasks = self._frame()
        self.i += 1
        return [{"task_id": k, "id": f"id-{k}", "state": s, "try_number": n} for k, (s, n) in tasks.items()]

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[Json]:
        return []


def _watcher(frames: list[object], interval: float = 1.0) -> tuple[RunWatcher, FakeClock]:
    clock = FakeClock()
    w = RunWatcher(FakeApi(frames), "d", "r", interval=interval, clock=clock, sleep=clock.sleep)
    w.start_clock()
    return w, clock


def test_watch_returns_when_final_and_records_transitions() -> None:
    frames: list[object] = [
        ("queued", {"a": ("scheduled", 1), "b": ("scheduled", 1)}),
        ("running", {"a": ("running", 1), "b": ("queued", 1)}),
        ("running", {"a": ("running", 1), "b": ("running", 1)}),
        ("success", {"a": ("success", 1), "b": ("success", 1)}),
    ]
    w, _ = _watcher(frames)
    res = w.watch(deadline=60)
    assert res.final and res.run_state == "success"
    assert res.elapsed == 3.0
    assert [(tr.t, tr.task_id, tr.state) for tr in res.transitions if tr.task_id == "b"] == [
        (0.0, "b", "scheduled"),
        (1.0, "b", "queued"),
        (2.0, "b", "running"),
        (3.0, "b", "success"),
    ]
    assert res.last is not None and res.last.count() == {"success": 2}


def test_watch_gives_up_at_the_deadline_with_the_last_snapshot() -> None:
    w, _ = _watcher([("running", {"a": ("queued", 1), "b": ("success", 1)})], interval=0.5)
    res = w.watch(deadline=10)
    assert not res.final
    assert res.run_state == "running"
    assert 10 <= res.elapsed <= 10.5
    assert res.last is not None and res.last.tasks["a"].state == "queued"
    # Unchanged states are recorded once, not once per poll.
    assert len(res.transitions) == 2


def test_watch_counts_api_errors_and_keeps_polling() -> None:
    frames: list[object] = [ConnectionRefusedError(), OSError("reset"), ("success", {"a": ("success", 1)})]
    w, _ = _watcher(frames)
    res = w.watch(deadline=60)
    assert res.final and res.api_errors == 2


def test_watch_stops_when_asked() -> None:
    stop = threading.Event()
    stop.set()
    w, _ = _watcher([("running", {"a": ("running", 1)})])
    res = w.watch(deadline=60, stop=stop)
    assert not res.final and res.elapsed == 0.0


def test_a_retry_is_a_new_transition() -> None:
    frames: list[object] = [
        ("running", {"a": ("running", 1)}),
        ("running", {"a": ("up_for_retry", 1)}),
        ("running", {"a": ("queued", 2)}),
        ("success", {"a": ("success", 2)}),
    ]
    w, _ = _watcher(frames)
    res = w.watch(deadline=60)
    assert [(tr.try_number, tr.state) for tr in res.transitions] == [
        (1, "running"),
        (1, "up_for_retry"),
        (2, "queued"),
        (2, "success"),
    ]


def test_transition_is_plain_data() -> None:
    assert Transition(1.0, "a", 1, "queued") == Transition(1.0, "a", 1, "queued")


class _AllAdmins31(http.server.BaseHTTPRequestHandler):
    """Airflow 3.1's all-admins API: 401 without a token, a token for anyone at GET /auth/token; a
    DAG run posted as JSON is created, 409 if its id was posted before."""

    runs: ClassVar[set[str]] = set()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = self.headers["Content-Type"] == "application/json" and body["dag_run_id"] not in self.runs
        self.runs.add(body["dag_run_id"])
        self._send(200 if ok else 409, {"dag_run_id": body["dag_run_id"]})

    def do_GET(self) -> None:
        if self.path == "/auth/token":
            self._send(201, {"access_token": "t0k"})
        elif self.headers.get("Authorization") == "Bearer t0k":
            self._send(200, {"dag_id": "d"})
        else:
            self._send(401, {"detail": "Not authenticated"})

    def _send(self, code: int, body: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_rest_api_fetches_an_all_admins_token_when_the_api_asks_for_one() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _AllAdmins31)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = RestApi(f"http://127.0.0.1:{server.server_port}")
        assert api.get("/api/v2/dags/d") == {"dag_id": "d"}
        assert api.get("/api/v2/dags/d", timeout=2.0) == {"dag_id": "d"}
        # The soak's trigger goes through the same call (tools.measure.e2e.web).
        assert soak.trigger(api.base, "r1") == "created" and soak.trigger(api.base, "r1") == "exists"
    finally:
        server.shutdown()
        server.server_close()

"""The UI poller without Airflow: its counts from recorded poll histories, its records file, the
token as the UI gets it, and its threads against a loopback stand-in of the api-server."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from tools.measure.e2e import uipoll
from tools.measure.e2e.uipoll import Endpoint, PollRecord, UiPoller

POOL_500 = (
    "sqlalchemy.exc.TimeoutError: QueuePool limit of size 5 overflow 10 reached, connection timed out, "
    "timeout 30.00"
)


def _history() -> list[PollRecord]:
    """Issue 52's worst round as the poller saw it: four endpoints every 3 s, then all four held
    behind the blocked event loop, one of them answered 500 by the pool timeout, one unanswered."""
    out = [PollRecord(3.0 * i, e.name, 0.08, 200) for i in range(5) for e in uipoll.ENDPOINTS]
    out += [
        PollRecord(15.0, "getDagRun", 31.2, 500, POOL_500),
        PollRecord(15.0, "getTaskInstances", 30.9, 200),
        PollRecord(15.0, "getGridRuns", 5.0, 200),  # exactly the threshold: slow
        PollRecord(15.0, "getGridTiSummariesStream", 60.0, None, "TimeoutError: timed out"),
        PollRecord(75.0, "getDagRun", 4.99, 500, "Internal Server Error"),
    ]
    return out


def test_summarise_counts_slow_requests_the_longest_and_pool_timeouts() -> None:
    f = uipoll.summarise(_history(), "cookie")
    assert f.requests == 25
    assert f.slow == 4  # 31.2, 30.9, 5.0 and the unanswered 60 s; not 4.99
    assert (f.longest_s, f.longest_endpoint) == (60.0, "getGridTiSummariesStream")
    assert (f.server_errors, f.pool_timeouts, f.no_answer) == (2, 1, 1)
    assert f.as_json()["longest_s"] == 60.0
    assert f.text() == (
        "UI poller: 25 requests, 4 of 5 s or more, longest 60.0 s (getGridTiSummariesStream), "
        "2 answered 5xx (1 pool timeouts), 1 unanswered; token cookie"
    )


def test_summarise_a_quiet_round_and_no_round() -> None:
    quiet = uipoll.summarise(PollRecord(3.0 * i, "getDagRun", 0.1 + i / 100, 200) for i in range(10))
    assert (quiet.slow, quiet.server_errors, quiet.no_answer) == (0, 0, 0)
    assert quiet.longest_s == pytest.approx(0.19)
    empty = uipoll.summarise([])
    assert (empty.requests, empty.longest_s, empty.longest_endpoint) == (0, None, None)
    assert "longest -" in empty.text() and empty.text().endswith("token none")


def test_records_round_trip_through_their_file(tmp_path: Path) -> None:
    path = tmp_path / uipoll.RECORDS_FILE
    uipoll.write_records(path, _history())
    assert uipoll.read_records(path) == _history()
    assert uipoll.read_records(tmp_path / "missing.jsonl") == []


def test_the_login_cookie_is_found_among_others() -> None:
    headers = {"set-cookie": "other=1; Path=/, _token=eyJ.a-b_c.d; HttpOnly; Path=/; SameSite=lax"}
    assert uipoll._cookie(headers, "_token") == "eyJ.a-b_c.d"
    assert uipoll._cookie({"set-cookie": "_token=; Path=/"}, "_token") is None
    assert uipoll._cookie({}, "_token") is None


# -- against a loopback api-server ----------------------------------------------------------------


class _Api(http.server.BaseHTTPRequestHandler):
    """SimpleAuthManager's all-admins login (the cookie) or its token endpoint, and four pages."""

    cookie: ClassVar[bool] = True
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/auth/token/login":
            self.send_response(307)
            self.send_header("Location", "/")
            if self.cookie:
                self.send_header("Set-Cookie", "_token=jwt-ui; HttpOnly; Path=/; SameSite=lax")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/auth/token":
            self._send(201, b'{"access_token": "jwt-all-admins"}')
        elif self.path.startswith("/slow"):
            time.sleep(0.25)
            self._send(200, b"{}")
        elif self.path.startswith("/broken"):
            self._send(500, POOL_500.encode())
        else:
            self._send(200, b"{}")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(cookie: bool) -> tuple[http.server.ThreadingHTTPServer, type[_Api]]:
    class Api(_Api):
        pass

    Api.cookie = cookie
    Api.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, Api


@pytest.mark.timeout(20)
def test_the_poller_polls_each_endpoint_on_its_own_timer_with_the_uis_token() -> None:
    server, handler = _serve(cookie=True)
    endpoints = (
        Endpoint("fast", "/fast/{dag_id}/{run_id}"),
        Endpoint("slow", "/slow/{dag_id}"),
        Endpoint("broken", "/broken?run_ids={run_id}"),
    )
    t0 = time.monotonic()
    poller = UiPoller(
        f"http://127.0.0.1:{server.server_port}",
        "d",
        "manual run/1",
        lambda: time.monotonic() - t0,
        interval=0.1,
        endpoints=endpoints,
        timeout=5.0,
    )
    try:
        poller.start()
        time.sleep(1.0)
        records = poller.stop()
    finally:
        server.shutdown()
        server.server_close()
    assert poller.token == "jwt-ui" and poller.token_source.startswith("_token cookie")
    polled = [(p, auth) for p, auth in handler.seen if not p.startswith("/auth/")]
    assert polled and all(auth == "Bearer jwt-ui" for _, auth in polled)
    assert "/fast/d/manual%20run%2F1" in {p for p, _ in polled}
    by = {name: [r for r in records if r.endpoint == name] for name in ("fast", "slow", "broken")}
    # every 0.1 s for about a second; the 0.25 s endpoint skips the ticks that come while it waits
    assert 6 <= len(by["fast"]) <= 12
    assert 3 <= len(by["slow"]) <= 5
    assert all(r.seconds >= 0.25 for r in by["slow"])
    assert all(r.status == 500 and "QueuePool limit" in r.detail for r in by["broken"])
    assert [r.t for r in records] == sorted(r.t for r in records)
    f = poller.figures()
    assert f.pool_timeouts == f.server_errors == len(by["broken"]) and f.no_answer == 0


@pytest.mark.timeout(20)
def test_without_the_login_cookie_the_poller_takes_the_all_admins_token_and_counts_no_answer() -> None:
    server, _ = _serve(cookie=False)
    port = server.server_port
    poller = UiPoller(f"http://127.0.0.1:{port}", "d", "r", time.monotonic, interval=0.1, timeout=5.0)
    poller.login()
    server.shutdown()
    server.server_close()
    assert (poller.token, poller.token_source) == ("jwt-all-admins", "GET /auth/token")
    # The api-server gone: each endpoint's request gets no answer, and is counted.
    poller.start()
    time.sleep(0.3)
    f = uipoll.summarise(poller.stop())
    assert f.requests >= len(uipoll.ENDPOINTS) and f.no_answer == f.requests

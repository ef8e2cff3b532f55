#
# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under the License.
"""
The revoked-token check of every authenticated request holds no other request while it waits.

``RevokedToken.is_revoked`` is a database query: with the connection pool full (the execution
API's task starts hold it) it waits up to ``pool_timeout`` for a connection. Run on the event
loop, that wait stops every request of the API server, including the ones whose finishing
would hand a connection back. The lookup here stands in for that wait without a database.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from dataclasses import dataclass, field

import pytest
from jwt import InvalidTokenError

from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

OFF_LOOP_PATCH = "0011-check-revoked-tokens-off-the-api-servers-event-loop.patch"
# 3.1 checks no revoked tokens: its token check never waits for the database.
HAS_REVOCATION = importlib.util.find_spec("airflow.models.revoked_token") is not None

# How long the stand-in lookup waits for a connection (the real one: up to 30 s).
POOL_WAIT = 3.0
# A request that needs no database is served within this while the lookup waits, on a loaded
# two-CPU machine; far below POOL_WAIT, so a lookup on the loop cannot pass for one off it.
SERVED_WITHIN = 1.0

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> SimpleAuthManager:
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "lepatch-test-secret-not-for-production")
    return SimpleAuthManager()


@dataclass
class Lookup:
    """The revocation lookup: waits as a pool checkout does until ``released`` or POOL_WAIT."""

    revoked: bool = False
    calls: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def is_revoked(self, jti: str, *args: object, **kwargs: object) -> bool:
        self.calls += 1
        self.released.wait(POOL_WAIT)
        return self.revoked


@pytest.fixture
def lookup(monkeypatch: pytest.MonkeyPatch) -> Lookup:
    stand_in = Lookup()
    if HAS_REVOCATION:
        from airflow.models.revoked_token import RevokedToken

        monkeypatch.setattr(RevokedToken, "is_revoked", stand_in.is_revoked)
    return stand_in


def _token(manager: SimpleAuthManager) -> str:
    token: str = manager.generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer"))
    return token


@pytest.mark.fixed_by(OFF_LOOP_PATCH, lines=("3.2", "3.3", "3.4"))
def test_a_check_waiting_for_the_database_holds_no_other_request(
    manager: SimpleAuthManager, lookup: Lookup
) -> None:
    token = _token(manager)

    async def scenario() -> tuple[float, BaseUser]:
        started = time.monotonic()
        check = asyncio.create_task(manager.get_user_from_token(token))
        await asyncio.sleep(0.05)  # another request, one that needs no database
        served_after = time.monotonic() - started
        lookup.released.set()  # the pool hands the lookup a connection
        return served_after, await check

    served_after, user = asyncio.run(asyncio.wait_for(scenario(), POOL_WAIT * 4))

    assert served_after < SERVED_WITHIN, (
        f"a request was held {served_after:.1f} s while the revocation lookup waited for the database"
    )
    assert user.get_name() == "viewer"
    if HAS_REVOCATION:
        assert lookup.calls == 1


@pytest.mark.skipif(not HAS_REVOCATION, reason="this release checks no revoked tokens")
def test_a_revoked_token_is_still_refused(manager: SimpleAuthManager, lookup: Lookup) -> None:
    lookup.revoked = True
    lookup.released.set()

    with pytest.raises(InvalidTokenError, match="revoked"):
        asyncio.run(manager.get_user_from_token(_token(manager)))
    assert lookup.calls == 1

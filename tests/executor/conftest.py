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
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment

# In-process tests import airflow too: give them the same private, database-free home.
for _name, _value in environment().items():
    if _name != "PYTHONPATH":
        os.environ.setdefault(_name, _value)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fixed_by(patch): the patch of the series that fixes the bug this test reproduces"
    )


# fork is the Linux default before Python 3.14, forkserver from 3.14 on; spawn is macOS's. Set
# LEPATCH_START_METHODS=fork,spawn,forkserver to run every scenario under forkserver as well.
START_METHODS = os.environ.get("LEPATCH_START_METHODS", "fork,spawn").split(",")


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    """Each start method the executor's workers may be started with."""
    method: str = request.param
    return method

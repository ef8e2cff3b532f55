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


@pytest.fixture(params=["fork", "spawn"])
def start_method(request: pytest.FixtureRequest) -> str:
    """Both start methods: fork is the Linux default, spawn the macOS one (and 3.14's)."""
    method: str = request.param
    return method

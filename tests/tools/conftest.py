"""Fixtures shared by the delivery tools' tests: the pinned bases and a synthetic Airflow clone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools.shared.layout import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_airflow as syn


@pytest.fixture(scope="module")
def bases() -> dict[str, bytes]:
    found = syn.all_bases()
    if found is None:
        pytest.skip("the pinned wheels are not at hand")
    return found


@pytest.fixture
def world(tmp_path: Path, bases: dict[str, bytes]) -> tuple[Path, Layout, list[str]]:
    """A synthetic Airflow repository and a small series of three patches for it."""
    repo = syn.make_airflow_repo(tmp_path / "airflow", bases)
    names = syn.make_series(tmp_path / "patches", bases)
    return repo, Layout(patches_dir=tmp_path / "patches"), names

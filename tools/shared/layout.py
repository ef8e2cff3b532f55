"""Where things live in the repository; tests point an instance at a temporary tree."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tools.shared import pins

ROOT = Path(__file__).resolve().parents[2]

# Airflow repository layout of the executor's tests inside the patches.
REPO_TESTS_DIR = "airflow-core/tests/unit/executors/local_executor"


@dataclass(frozen=True)
class Layout:
    root: Path = ROOT
    patches_dir: Path | None = None

    @property
    def patches(self) -> Path:
        return self.patches_dir if self.patches_dir is not None else self.root / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches / "series"

    @property
    def resolutions(self) -> Path:
        return self.patches / "resolutions"

    @property
    def upstream_prs(self) -> Path:
        """Standalone upstream PRs against the pre-release line: not part of the series."""
        return self.patches / "upstream-prs"

    @property
    def overlay(self) -> Path:
        return self.root / "airflow_overlay"

    @property
    def tests_executor(self) -> Path:
        return self.root / "tests" / "executor"

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def cache(self) -> Path:
        env = os.environ.get("LEPATCH_CACHE")
        return Path(env) if env else self.build / "cache"

    @property
    def constraints(self) -> Path:
        return self.root / "constraints"

    def overlay_files(self, line: str) -> dict[str, bytes]:
        """The overlay of ``line`` (``airflow_overlay/<line>/``): its upstream files, by installed path."""
        root = self.overlay / line
        return {
            f.package_path: (root / f.package_path).read_bytes()
            for f in pins.UPSTREAM_FILES
            if (root / f.package_path).is_file()
        }

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


DEFAULT = Layout()

"""The pinned apache-airflow-core release lines: the one place versions and hashes live.

Each line's ``local_executor.py`` is byte-identical across the patch releases listed in
``covers`` (``python -m tools pins --check`` proves that by hash instead of trusting it).
A downloaded wheel whose sha256 differs from the one recorded here is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DISTRIBUTION = "apache-airflow-core"
# Where the executor lives inside the wheel, and where it lives in Airflow's git repository.
PACKAGE_PATH = "airflow/executors/local_executor.py"
REPO_PATH = "airflow-core/src/airflow/executors/local_executor.py"


@dataclass(frozen=True)
class Line:
    """One release line: the newest patch release is the base the series applies to."""

    name: str  # "3.3"
    version: str  # exact version of the base wheel
    wheel_sha256: str
    source_sha256: str  # sha256 of local_executor.py inside the wheel
    branch: str  # upstream backport branch
    # Other patch releases whose wheel and local_executor.py hashes are recorded, all
    # expected to carry the same local_executor.py as the base.
    covers: dict[str, str] = field(default_factory=dict)
    # A pre-release base stands in for upstream main (the next line before its release).
    prerelease: bool = False

    @property
    def label(self) -> str:
        """How the line is shown everywhere: "3.3 (3.3.2)", "3.4 (3.4.0b2, pre-release)"."""
        return f"{self.name} ({self.version}{', pre-release' if self.prerelease else ''})"

    @property
    def wheel_name(self) -> str:
        return f"apache_airflow_core-{self.version}-py3-none-any.whl"


LINES: tuple[Line, ...] = (
    Line(
        name="3.3",
        version="3.3.2",
        wheel_sha256="99258922bccec15be4700ff89f3c942b8acd93407e263c287ce863e671bb3c50",
        source_sha256="b96e1ce1458c7d7535c769127238ba1996bfa7f045ef644635cacc78895933a7",
        branch="v3-3-test",
        covers={
            "3.3.0": "87c0afe38cfbfcb2b8bf91cd2f9af81d053346544b1997abd5794e94697775c1",
            "3.3.1": "28c6aa88bdd47a4401436f1bfefbc979236de16fa4962d408218c67b8f9a00b8",
        },
    ),
    Line(
        name="3.2",
        version="3.2.2",
        wheel_sha256="877be429d59193b5e9aab1ae69f44066134bf483c633e9f7c59a9220ebfcc013",
        source_sha256="933e304416279884c0ac7a85a8309cf5d9073ecc88f6f87e7f7c78fb9aa4b57b",
        branch="v3-2-test",
        covers={
            "3.2.0": "b04b35b1224549a20786aab37af73e1608e67830fda61341a3fcd7480f13192b",
            "3.2.1": "9f13bb8bde8ab5e4910c5fc2d1fd637af488f56e4c32c062c1de6dc83593a1b5",
        },
    ),
    Line(
        name="3.1",
        version="3.1.8",
        wheel_sha256="ba8593b64eb11608ae16b2378700afdacc2c1be9dfd03719860aa3a118556ac6",
        source_sha256="999f1d26e696db3f42efe359620f9a580ef4259ca66f5f866be8dee9cad621a0",
        branch="v3-1-test",
        covers={
            "3.1.5": "2da6bf39b5473893fc6a2a9408b4bb9151c3a65b2133a4a23640cb66af79224c",
            "3.1.6": "8021583e6ceb7cb98202035477a6cb7aa3c9a9b472174949ad1db597786ac35f",
            "3.1.7": "831ad153a0b94f467dd1fc720df234c0c47eaf4c3367508ae398d8525ca90f62",
        },
    ),
    Line(
        name="3.4",
        version="3.4.0b2",
        wheel_sha256="3244cd958cef647aeaf6c5b6679598431c44e5ad7376d1eaec1d71a0d7593bb6",
        source_sha256="6be50792ce223c671097cef9c29a689a09fbd842f9ea7524e372a564884d03e0",
        branch="main",
        prerelease=True,
    ),
)

PRIMARY = LINES[0]


def get_line(name: str) -> Line:
    """Find a line by its name ("3.3") or by any version it covers ("3.3.1")."""
    for line in LINES:
        if name in (line.name, line.version) or name in line.covers:
            return line
    known = ", ".join(f"{line.name} ({line.version})" for line in LINES)
    raise KeyError(f"unknown release line {name!r}; pinned lines: {known}")

"""The pinned release lines: the one place versions and hashes live.

The series patches two upstream files, each shipped by its own distribution: the executor
(``apache-airflow-core``) and task-sdk's supervisor (``apache-airflow-task-sdk``, which every
worker runs its task process under). A line pins one release of each. Each line's
``local_executor.py`` is byte-identical across the patch releases listed in ``covers``, and its
``supervisor.py`` across the task-sdk releases in ``sdk_covers`` (``python -m tools pins
--check`` proves both by hash instead of trusting it). A downloaded wheel whose sha256 differs
from the one recorded here is refused.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from tools.shared.versions import version_key

DISTRIBUTION = "apache-airflow-core"
# Where the executor lives inside the wheel, and where it lives in Airflow's git repository.
PACKAGE_PATH = "airflow/executors/local_executor.py"
REPO_PATH = "airflow-core/src/airflow/executors/local_executor.py"


@dataclass(frozen=True)
class UpstreamFile:
    """One upstream file the series patches: where the wheel has it, where Airflow's repo does."""

    name: str  # how it is shown: "local_executor.py"
    distribution: str
    package_path: str  # inside the wheel and site-packages (the overlay's layout)
    repo_path: str  # in Airflow's git repository (the patches' layout)
    repo_tests_dir: str  # where the series puts its tests for this file, in Airflow's repository
    tests_dir: str  # where those tests are derived to, in this repository
    # The overlay replaces it on the line's base release only: the line's other releases may ship
    # another version of it, or none (an installed core without it is not an error).
    pinned_on_base_only: bool = False


EXECUTOR = UpstreamFile(
    name="local_executor.py",
    distribution=DISTRIBUTION,
    package_path=PACKAGE_PATH,
    repo_path=REPO_PATH,
    repo_tests_dir="airflow-core/tests/unit/executors/local_executor",
    tests_dir="tests/executor",
)
SUPERVISOR = UpstreamFile(
    name="supervisor.py",
    distribution="apache-airflow-task-sdk",
    package_path="airflow/sdk/execution_time/supervisor.py",
    repo_path="task-sdk/src/airflow/sdk/execution_time/supervisor.py",
    repo_tests_dir="task-sdk/tests/task_sdk/execution_time",
    tests_dir="tests/supervisor",
)
# The API server's token check (3.2+: a revoked-token lookup in the database on every request),
# shipped by apache-airflow-core beside the executor: it stalls every request when the pool is full.
AUTH_MANAGER = UpstreamFile(
    name="base_auth_manager.py",
    distribution=DISTRIBUTION,
    package_path="airflow/api_fastapi/auth/managers/base_auth_manager.py",
    repo_path="airflow-core/src/airflow/api_fastapi/auth/managers/base_auth_manager.py",
    repo_tests_dir="airflow-core/tests/unit/api_fastapi/auth/managers",
    tests_dir="tests/api_server",
    pinned_on_base_only=True,
)
# The scheduler's loop and the executors' base class (apache-airflow-core, beside the executor): the
# scheduler's idle sleep waits on what the executors say will have news (patch 12).
SCHEDULER = UpstreamFile(
    name="scheduler_job_runner.py",
    distribution=DISTRIBUTION,
    package_path="airflow/jobs/scheduler_job_runner.py",
    repo_path="airflow-core/src/airflow/jobs/scheduler_job_runner.py",
    repo_tests_dir="airflow-core/tests/unit/jobs/scheduler_idle_wait",
    tests_dir="tests/scheduler",
    pinned_on_base_only=True,
)
BASE_EXECUTOR = UpstreamFile(
    name="base_executor.py",
    distribution=DISTRIBUTION,
    package_path="airflow/executors/base_executor.py",
    repo_path="airflow-core/src/airflow/executors/base_executor.py",
    repo_tests_dir="airflow-core/tests/unit/executors/base_executor",
    tests_dir="tests/base_executor",
    pinned_on_base_only=True,
)
UPSTREAM_FILES: tuple[UpstreamFile, ...] = (EXECUTOR, SUPERVISOR, AUTH_MANAGER, SCHEDULER, BASE_EXECUTOR)


def upstream_file(repo_path: str) -> UpstreamFile | None:
    """The upstream file at ``repo_path`` in Airflow's repository, or None for any other path."""
    return next((f for f in UPSTREAM_FILES if f.repo_path == repo_path), None)


@dataclass(frozen=True)
class Pin:
    """One distribution's release as a line pins it."""

    file: UpstreamFile
    version: str
    wheel_sha256: str
    source_sha256: str  # of the upstream file inside the wheel
    covers: dict[str, str]  # other releases with the same file: version -> wheel sha256

    @property
    def wheel_name(self) -> str:
        return f"{self.file.distribution.replace('-', '_')}-{self.version}-py3-none-any.whl"


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
    # The apache-airflow-task-sdk release the line's base is tested with (its supervisor.py is the
    # base of the series' second file), and the task-sdk releases shipping the same supervisor.py.
    sdk_version: str = ""
    sdk_wheel_sha256: str = ""
    sdk_source_sha256: str = ""
    sdk_covers: dict[str, str] = field(default_factory=dict)
    # The other task-sdk releases the line's core releases require, each shipping its own
    # supervisor.py: version -> wheel sha256, and version -> sha256 of its supervisor.py. The
    # series' supervisor patches are applied to each of them (``airflow_overlay/<line>/task-sdk-<v>/``).
    sdk_releases: dict[str, str] = field(default_factory=dict)
    sdk_release_sources: dict[str, str] = field(default_factory=dict)
    # Each core release of the line (base and covers) -> the task-sdk release it requires (``==``):
    # core pins task-sdk exactly, so this pair is the only one pip installs.
    core_sdk: dict[str, str] = field(default_factory=dict)
    # sha256 of the base release's base_auth_manager.py, on the lines whose API server checks
    # revoked tokens (3.2+); "" where the series leaves the file alone. The line's other core
    # releases ship other versions of it: only the base's is patched (docs/releases.md).
    auth_source_sha256: str = ""
    # sha256 of the base release's scheduler_job_runner.py and base_executor.py (``SCHEDULER.name``,
    # ``BASE_EXECUTOR.name`` -> sha256); like the API server's file, only the base's is patched.
    core_sources: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How the line is shown everywhere: "3.3 (3.3.2)", "3.4 (3.4.0b2, pre-release)"."""
        return f"{self.name} ({self.version}{', pre-release' if self.prerelease else ''})"

    @property
    def wheel_name(self) -> str:
        return f"apache_airflow_core-{self.version}-py3-none-any.whl"

    @property
    def pins(self) -> tuple[Pin, ...]:
        """Every upstream file this line pins a base of (the supervisor only where recorded)."""
        out = [Pin(EXECUTOR, self.version, self.wheel_sha256, self.source_sha256, self.covers)]
        if self.sdk_version:
            out.append(
                Pin(
                    SUPERVISOR,
                    self.sdk_version,
                    self.sdk_wheel_sha256,
                    self.sdk_source_sha256,
                    self.sdk_covers,
                )
            )
        if self.auth_source_sha256:
            out.append(Pin(AUTH_MANAGER, self.version, self.wheel_sha256, self.auth_source_sha256, {}))
        for f in (SCHEDULER, BASE_EXECUTOR):
            if f.name in self.core_sources:
                out.append(Pin(f, self.version, self.wheel_sha256, self.core_sources[f.name], {}))
        return tuple(out)

    def pin(self, file: UpstreamFile) -> Pin | None:
        return next((p for p in self.pins if p.file == file), None)

    @property
    def sdk_release_pins(self) -> tuple[Pin, ...]:
        """One supervisor pin per task-sdk release in ``sdk_releases`` (each its own base file)."""
        return tuple(
            Pin(SUPERVISOR, version, self.sdk_releases[version], self.sdk_release_sources[version], {})
            for version in self.sdk_releases
        )

    def supervisor_pin(self, sdk_version: str | None) -> Pin | None:
        """The supervisor base the overlay for ``sdk_version`` is built on; None if none is verified."""
        base = self.pin(SUPERVISOR)
        if base is not None and sdk_version in (base.version, *base.covers):
            return base
        return next((p for p in self.sdk_release_pins if p.version == sdk_version), None)

    @property
    def sdk_versions(self) -> list[str]:
        """Every task-sdk release the line's overlay has a verified supervisor for."""
        base = self.pin(SUPERVISOR)
        found = [*((base.version, *base.covers) if base else ()), *self.sdk_releases]
        return sorted(found, key=version_key)


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
        sdk_version="1.3.2",
        sdk_wheel_sha256="5ff196842b7bc203e13332592ab78ed82cfa1225368a16bb91bf9d5705c62293",
        sdk_source_sha256="d2c2b62d83273014970f1347ef2f35f412010058bb1ceddc67bb6e8fc1dcff78",
        sdk_releases={
            "1.3.0": "b4220241e33b80f79113dd21cec414f98baf5028901dcf5ac96156c8fd9fe74c",
            "1.3.1": "4c5619ce9bdc0f76becd4fe2d0c85aea0667ef6c213e8c8785ecdcc01176d41b",
        },
        sdk_release_sources={
            "1.3.0": "ec8e4712d94c4c536346c9d2f3bdf073f078060e8be18c3ada29b86e1ec5d296",
            "1.3.1": "66ecd0ab87f7f3dec5668d774f21dabd5edd05ed54471081e963b325976283fb",
        },
        core_sdk={
            "3.3.0": "1.3.0",
            "3.3.1": "1.3.1",
            "3.3.2": "1.3.2",
        },
        auth_source_sha256="e427c76d91ed2fa153d54d02bef72b996243e2cb376b5ab75b4628dfe156ca36",
        core_sources={
            "scheduler_job_runner.py": "f70cb02c32d618dcbc94a9898dd0c40fb68aca607020258404f6ca580bca1873",
            "base_executor.py": "d19865501f52444d1eb1f36f898faaaf1927d85ae0d60e2e8c34cfe801675518",
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
        sdk_version="1.2.2",
        sdk_wheel_sha256="709552227b8139b1264413fdc4f0ef3034dd0519c8adeaffd0c9c908a608e6c5",
        sdk_source_sha256="f000cde29b00efc018404d41507d1cfa9fd6522fd4d6bbf5e7549eb294faeba6",
        sdk_releases={
            "1.2.0": "a20b98493905ad879ec3f806a0b92da3f1f7fb95e1f196c0ff1985e6286aad4e",
            "1.2.1": "2816d191b0777034e69cc5a73b81a8cacaa77f6b95f6daa48f1563339a14c6f1",
        },
        sdk_release_sources={
            "1.2.0": "afd53701518639627701c2f7a292b4bfa6a416d7724ae483416ad65fe8bd6abb",
            "1.2.1": "7a192ac853fed7d45bc399190f9402d0fc6694ded9fe38a3784fef1f3417cc3e",
        },
        core_sdk={
            "3.2.0": "1.2.0",
            "3.2.1": "1.2.1",
            "3.2.2": "1.2.2",
        },
        auth_source_sha256="2847e49d4425e526ecb5c4f73571f0fc14d1ad133ba0569782504d0f9b0ed516",
        core_sources={
            "scheduler_job_runner.py": "60bd40cf1e21eb36ff598fb35f0cde699e5c166af9905abb5cba8ffee3390eb2",
            "base_executor.py": "9d0cac7b9ab07ed17def7dbd2acffdea38de194b225f356ff27ec7d750fd22ad",
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
        sdk_version="1.1.8",
        sdk_wheel_sha256="bd4d971b7450a297b4c9f59410b1d6bce482c349cd187b393a5b8842a2af57e3",
        sdk_source_sha256="26a23280e7055c3640bb091fa9522efe5f706722d1e02ecc40ff1cab0f857c41",
        sdk_covers={
            "1.1.6": "a9f97272f878c65133074da740062beaa7d422bf0b6a46c1abc98861ef601390",
            "1.1.7": "8c30a0f4a7111a18a5a7d6b0de18a235b805efc9491e9d1ba9fda43cd7e9d51e",
        },
        sdk_releases={
            "1.1.5": "d6ecdb5a5350feee01c861ac0d9e7ad50fcae914e459ef6a69a1bb3bc5f9a5e2",
        },
        sdk_release_sources={
            "1.1.5": "9919f8571c595a64e3bb77e3bd2b906bfb4b10567421e524a24fede9332195b7",
        },
        core_sdk={
            "3.1.5": "1.1.5",
            "3.1.6": "1.1.6",
            "3.1.7": "1.1.7",
            "3.1.8": "1.1.8",
        },
        core_sources={
            "scheduler_job_runner.py": "a2fccfb7a012ba6091f6e83c63054885bdabb4113cb67f4dba193073d6304acb",
            "base_executor.py": "5ba1d7b995eade6efe8bea9a5c7fd81bc2c531957c3b4e781d852b655dae95c0",
        },
    ),
    Line(
        name="3.4",
        version="3.4.0b2",
        wheel_sha256="3244cd958cef647aeaf6c5b6679598431c44e5ad7376d1eaec1d71a0d7593bb6",
        source_sha256="6be50792ce223c671097cef9c29a689a09fbd842f9ea7524e372a564884d03e0",
        branch="main",
        prerelease=True,
        sdk_version="1.4.0b2",
        sdk_wheel_sha256="621afa4e10c8cacdf33028d29ec7506d0c94c543e1f04a66ac77f9f079789f74",
        sdk_source_sha256="6f04b4108f61aaa169bb3e68b245a982270be35806360a2986cf1f9ea0f71fae",
        core_sdk={
            "3.4.0b2": "1.4.0b2",
        },
        auth_source_sha256="41821d2a7e9389a56aacdce403de5d6fd6ffe7684911430fca1d392baec79593",
        core_sources={
            "scheduler_job_runner.py": "6ed329578011bcd35737795c161b00ec303ad7e2405b54334c19f6fbd3793da1",
            "base_executor.py": "c9b702c43f446b4d6106178fca2ba35d407956d7a094cfaee184839aab6142c1",
        },
    ),
)

PRIMARY = LINES[0]

# The source distribution of task-sdk releases the lines pin, by version -> its sha256 as PyPI
# publishes it: each carries upstream's own tests/task_sdk/execution_time/test_supervisor.py for that
# release, run on the patched and unpatched supervisor.py (tools.delivery.upstream_supervisor_tests).
SDK_SDIST_SHA256: dict[str, str] = {
    "1.1.5": "4a4d31c07f3b7c51374f74635d70e1f2ffb25f116dc50f1310533ee3c63258d8",
    "1.1.6": "731e7931d18de3f53438eac36e93b43a06e126ec675b0c13d727a8b75892eb5a",
    "1.1.7": "658815d5d93c8b3e04432c50d31bcec382f4637466ea558bc13e97907c725bc5",
    "1.1.8": "d9b6027906a0e179c7ddc550c13717663785460a539b933741f22c47d10f4930",
    "1.2.0": "d2c4d173388f751e1d900a3f5e67fea3518822b63dd20b60a1bdbf92cdf96e8c",
    "1.2.1": "ac9400cb477473a9d9eb6a5b50d2979fd1b0b50f96c6d29b4d0e924defc6179c",
    "1.2.2": "3c8b3c4c86fe97dad5779004218c351cfd85f3dfc5a3f68b86127f266f9b286a",
    "1.3.0": "13d432b829f958f09bf8dfb20085870886fe60d2646958bde1befa9b018d0406",
    "1.3.1": "21c1086c133ede94defde2b455541cadadf564f7e6d189d1af22c6ef186bb6e3",
    "1.3.2": "d9a1c7785684a215df3927b028a44b2b6927dacebd54c0d281b5906febc3efef",
    "1.4.0b2": "9a887b82d50989f5edb955f3443460510b717a9481fc35d26950ba9ad8b4aab6",
}


def get_line(name: str) -> Line:
    """Find a line by its name ("3.3") or by any version it covers ("3.3.1")."""
    for line in LINES:
        if name in (line.name, line.version) or name in line.covers:
            return line
    known = ", ".join(f"{line.name} ({line.version})" for line in LINES)
    raise KeyError(f"unknown release line {name!r}; pinned lines: {known}")


def line_arg(name: str) -> Line:
    """The ``type=`` of every ``--line``: the line a name or covered version names, resolved as the
    arguments are parsed (argparse reports an unknown one with the pinned lines)."""
    try:
        return get_line(name)
    except KeyError as e:
        raise argparse.ArgumentTypeError(str(e.args[0])) from None


def add_line_options(parser: argparse.ArgumentParser) -> None:
    """``--line`` (repeatable) for a command that works on every pinned line by default."""
    help_ = "only this line (repeatable; default: every line)"
    parser.add_argument("--line", action="append", type=line_arg, help=help_)


def selected_lines(args: argparse.Namespace) -> list[Line]:
    """The lines ``add_line_options``' ``--line`` names, in the order given; every line without one."""
    return list(args.line or LINES)

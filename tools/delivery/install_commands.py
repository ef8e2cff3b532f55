"""``nox -s overlay``: the commands that put the series into an operator's Airflow, for one release.

There is one install path: Airflow's own core and task-sdk wheels rebuilt with the series' files
(``nox -s wheels``, :mod:`tools.delivery.wheels`). For one apache-airflow-core release, named
(``--release 3.3.2``) or read from an environment (``--python ENV/bin/python``), this prints the
command that builds its two wheels, the one ``pip install`` every host runs (the scheduler, the API
server, Celery and Edge workers; an image runs it in its Dockerfile) and the way back to PyPI's
build. It changes nothing itself: pip installs, records and uninstalls, as for any other wheel.

With ``--python`` it also says what that environment has: PyPI's release, or the patched wheels
with each file they recorded checked (exit 3 if one changed since), and a record of the overlay
installer this command replaces, if one is left.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.delivery import wheels
from tools.engine import releases
from tools.shared import pins
from tools.shared.layout import DEFAULT

CORE, SDK = pins.DISTRIBUTION, pins.SUPERVISOR.distribution
# What each host runs of the series; every one gets the same two wheels (one install path).
HOSTS = (
    ("scheduler", "runs the executor, and with LocalExecutor task-sdk's supervisor in its workers"),
    ("API server", "runs the token check, patch 11 on 3.2-3.4"),
    ("Celery and Edge workers", "run task-sdk's supervisor; the executor's file never runs there"),
)
RETIRED_STATE_DIR = "lepatch-overlay"  # what the retired overlay installer kept in an environment


def release_of(version: str) -> tuple[pins.Line, str, str]:
    """The line, core release and task-sdk release of ``version``; a one-line refusal naming the
    nearest verified release where no patched wheel is verified for it."""
    public, _ = wheels.split_local(version)
    for line in pins.LINES:
        if public in releases.verified_versions(line) and public in line.core_sdk:
            return line, public, line.core_sdk[public]
    nearest = releases.nearest_verified(public)
    way = (
        f"the nearest verified release is {nearest[1]} (the {nearest[0].name} line): "
        f"`nox -s overlay -- --release {nearest[1]}` prints its commands"
        if nearest
        else "no newer release is verified either"
    )
    raise wheels.WheelsError(f"{CORE} {public}: no patched wheels are verified for it; {way}")


def commands(version: str, wheels_dir: str = "dist/wheels", pip_install: str = "pip install") -> str:
    """What to run for core release ``version``: build, install on every host, go back."""
    line, core, sdk = release_of(version)
    label = wheels.local_label()
    install = f"{pip_install} --upgrade --find-links {wheels_dir} '{CORE}=={core}' '{SDK}=={sdk}'"
    reinstall = "--reinstall" if pip_install.startswith("uv ") else "--force-reinstall"  # uv's word for it
    back = f"{pip_install} {reinstall} --no-deps '{SDK}==={sdk}' '{CORE}==={core}'"
    hosts = "\n".join(f"   {name}: {what}" for name, what in HOSTS)
    image = f"pip install --upgrade --find-links /wheels '{CORE}=={core}' '{SDK}=={sdk}'"
    return f"""\
{CORE} {core} (line {line.name}) with {SDK} {sdk}: the patched wheels {core}+{label} and {sdk}+{label}

1. Build them in this checkout, into {wheels_dir}/ (copy the folder to each host, or serve its simple/):
   nox -s wheels -- --line {line.name}

2. Install them on each host, in its Airflow environment, with the same command:
{hosts}
     {install}
   an image (FROM apache/airflow:{core}):
     COPY {wheels_dir} /wheels
     RUN {image}
   --upgrade replaces PyPI's {core} and {sdk}; task-sdk is named too: core pins it exactly, and pip
   keeps an installed task-sdk that satisfies that pin.

3. Back to PyPI's build (=== matches {core} alone, never {core}+{label}):
   {back}
"""


def environment_report(installed: wheels.Installed) -> tuple[str, int]:
    """What ``installed`` has, in a line or two, and the exit code: 3 if a patched file changed."""
    said = [installed.describe()]
    retired = installed.prefix / RETIRED_STATE_DIR
    if retired.is_dir():
        said.append(
            f"{retired}: left by the retired overlay installer; step 2 (or 3) reinstalls both distributions, "
            "which puts their files back, then delete that folder"
        )
    return "\n".join(said), 3 if installed.changed() else 0


def run(args: argparse.Namespace) -> int:
    pip_install, rc, said = "pip install", 0, ""
    version = args.release
    if args.python is not None:
        installed = wheels.inspect(args.python)
        if CORE not in installed.versions:
            raise wheels.WheelsError(f"{args.python}: {CORE} is not installed in {installed.prefix}")
        version, pip_install = installed.versions[CORE], installed.pip_install()
        said, rc = environment_report(installed)
    print(commands(version, args.wheels, pip_install))
    if said:
        print(said)
    return rc


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "overlay",
        help="print the pip commands that install the patched wheels for one release, on every host",
        description=__doc__.split("\n\n")[0],
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--release", help=f"an {CORE} release, e.g. {pins.PRIMARY.version}")
    which.add_argument("--python", type=Path, help="an Airflow environment's interpreter: its core release")
    p.add_argument(
        "--wheels",
        default=DEFAULT.rel(wheels.DEFAULT_OUT),
        help="the folder of the built wheels as the hosts see it (default: dist/wheels)",
    )
    p.set_defaults(func=run)

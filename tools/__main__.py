"""``python -m tools COMMAND``: a thin CLI over the modules that do the work."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tools.shared.errors import ToolError

# Each module registers its subcommands with ``add_commands(subparsers)``; a subcommand's
# ``func(args) -> int`` is the exit code. Add a module here to add commands.
COMMAND_MODULES = (
    "tools.engine.releases",
    "tools.lint",
    "tools.engine.apply",
    "tools.engine.faithful",
    "tools.engine.checkout",
    "tools.engine.port",
    "tools.engine.verify",
    "tools.engine.own_tests",  # adds --own-tests to verify
    "tools.engine.testrun",
    "tools.measure.bench",
    "tools.measure.chaos",
    "tools.engine.venvs",
    "tools.engine.lock",
    "tools.delivery.newsfragments",
    "tools.delivery.install_commands",
    "tools.delivery.package",
    "tools.delivery.wheels_check",
    "tools.delivery.backport",
    "tools.delivery.pr",
    "tools.delivery.upstream_prs",
    "tools.delivery.upstream_tests",
    "tools.delivery.upstream_supervisor_tests",
    "tools.measure.e2e.cli",
    "tools.measure.e2e.soak",
    "tools.measure.model",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except ToolError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())

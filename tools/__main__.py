"""``python -m tools COMMAND``: a thin CLI over the modules that do the work."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tools.errors import ToolError

# Each module registers its subcommands with ``add_commands(subparsers)``; a subcommand's
# ``func(args) -> int`` is the exit code. Add a module here to add commands.
COMMAND_MODULES = (
    "tools.releases",
    "tools.series",
    "tools.apply",
    "tools.faithful",
    "tools.checkout",
    "tools.port",
    "tools.verify",
    "tools.bench",
    "tools.chaos",
    "tools.venvs",
    "tools.lock",
    "tools.newsfragments",
    "tools.overlay_install",
    "tools.package",
    "tools.backport",
    "tools.pr",
    "tools.upstream_prs",
    "tools.e2e.cli",
    "tools.model",
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

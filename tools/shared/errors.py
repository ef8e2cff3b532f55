"""The one exception type the tools raise for a user-facing failure: its message is one line."""

from __future__ import annotations


class ToolError(Exception):
    """A failure the CLI prints as is (no traceback) before exiting non-zero.

    The first line of the message says what failed; any further lines say how to
    reproduce or finish by hand.
    """

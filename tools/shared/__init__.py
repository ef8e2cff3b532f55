"""Shared ground: what every package stands on, importing nothing of the others.

``errors`` (ToolError), ``pins`` (the pinned lines: versions, hashes, the upstream files),
``layout`` (where things live in the repository), ``gitcmd`` (git, run one way) and
``commitmsg`` (commit messages, parsed and written).
"""

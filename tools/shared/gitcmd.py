"""The one way the tools run git: check the exit code, raise an error naming the command."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tools.shared.errors import ToolError

# Identity and dates for commits the tools make themselves, so object ids are reproducible.
TOOL_IDENT = {
    "GIT_AUTHOR_NAME": "lepatch",
    "GIT_AUTHOR_EMAIL": "lepatch@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "lepatch",
    "GIT_COMMITTER_EMAIL": "lepatch@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}

# why: a user's ~/.gitconfig (apply.whitespace=fix, diff.noprefix, format.signature, ...)
# would change what the engine produces; isolated calls see git's defaults only.
ISOLATED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
    "LANGUAGE": "C",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",
}


class GitError(ToolError):
    """A git command exited non-zero."""

    def __init__(self, args: list[str], cwd: Path | None, returncode: int, stdout: str, stderr: str):
        self.args_list = args
        self.cwd = cwd
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        first = next((ln for ln in stderr.splitlines() if ln.strip()), "") or stdout.strip()[:200]
        where = f" (in {cwd})" if cwd else ""
        super().__init__(f"`{shlex.join(args)}` failed with exit {returncode}{where}: {first}")


def git(
    *args: str | os.PathLike[str],
    cwd: Path | str | None = None,
    check: bool = True,
    input: bytes | str | None = None,
    env: Mapping[str, str] | None = None,
    isolated: bool = False,
) -> str:
    """Run ``git *args`` and return its stdout; raise :class:`GitError` on a non-zero exit.

    ``isolated`` ignores the user's and the system's git configuration; ``env`` adds to
    the environment. With ``check=False`` stdout is returned whatever the exit code.
    """
    argv = ["git", *(os.fspath(a) for a in args)]
    full_env = dict(os.environ)
    if isolated:
        full_env.update(ISOLATED_ENV)
    if env:
        full_env.update(env)
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        argv,
        cwd=cwd,
        input=data,
        capture_output=True,
        env=full_env,
        check=False,
    )
    out = proc.stdout.decode("utf-8", "surrogateescape")
    if check and proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace")
        raise GitError(argv, Path(cwd) if cwd else None, proc.returncode, out, err)
    return out


def identity_problem(cwd: Path | str) -> str | None:
    """Why git cannot commit in ``cwd`` (no user.name/user.email), in one line; None if it can.

    Checked before a tool starts committing: otherwise the first ``git cherry-pick`` fails and
    the failure reads as a patch that does not apply."""
    proc = subprocess.run(["git", "var", "GIT_COMMITTER_IDENT"], cwd=cwd, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    fatal = next((ln for ln in proc.stderr.splitlines() if ln.startswith("fatal:")), "no identity")
    return (
        f"{cwd}: git has no identity to commit with ({fatal.removeprefix('fatal: ')}); set one: "
        'git config --global user.name "Your Name" && git config --global user.email you@example.org'
    )

"""Edit the series with ordinary git: ``checkout`` makes a repository, ``refresh`` exports it.

``checkout --line L DIR`` commits a line's base (tagged ``lepatch-base``) and one commit
per patch on top (``git am``; where a line needs its recorded resolution, the engine's
stage tree under the patch's own author, date and message). ``refresh DIR`` exports the
commits back to ``patches/`` with ``git format-patch``: stable file names from
``patches/series``, the DEP-3 block kept (it lives in the commit message), dates and
authors from the commits, so refreshing an unchanged checkout changes no byte. On another
line, ``refresh --line L DIR`` records ``patches/resolutions/L/<patch>`` for exactly the
files whose content the automatic strict/3-way apply does not reproduce.
"""

from __future__ import annotations

import argparse
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tools.engine import apply as engine_mod
from tools.engine.apply import Engine, Tree
from tools.engine.series import Patch, parse_patch, read_series_names, unreviewed
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.gitcmd import TOOL_IDENT, GitError, git
from tools.shared.pins import Line

BASE_TAG = "lepatch-base"
FORMAT_PATCH = ("format-patch", "--full-index", "-N", "--no-signature", "--zero-commit")
_COMMITTER = {k: v for k, v in TOOL_IDENT.items() if k.startswith("GIT_COMMITTER_") and "DATE" not in k}


def _g(repo: Path, *args: str, env: dict[str, str] | None = None, input: bytes | None = None) -> str:
    return git(*args, cwd=repo, isolated=True, env=env, input=input)


def _tree_of(repo: Path, rev: str) -> Tree:
    out = _g(repo, "ls-tree", "-r", "-z", "--full-tree", rev)
    tree: Tree = {}
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        blob = meta.split()[2]
        tree[path] = _blob(repo, blob)
    return tree


def _blob(repo: Path, blob: str) -> bytes:
    # git() decodes with surrogateescape, so encoding back gives the exact bytes.
    return _g(repo, "cat-file", "blob", blob).encode("utf-8", "surrogateescape")


def _replace_worktree(repo: Path, tree: Tree) -> None:
    for p in _g(repo, "ls-files", "-z").split("\0"):
        if p and p not in tree:
            (repo / p).unlink()
    for rel, data in tree.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    _g(repo, "add", "-A")


def _author_env(repo: Path, rev: str = "HEAD") -> dict[str, str]:
    name, email, date = _g(repo, "log", "-1", "--format=%an%x00%ae%x00%aD", rev).strip("\n").split("\0")
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
        **_COMMITTER,
    }


def _commit_from_mail(repo: Path, patch_file: Path, tree: Tree) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        msg, body = Path(tmp) / "msg", Path(tmp) / "patch"
        info = _g(repo, "mailinfo", str(msg), str(body), input=patch_file.read_bytes())
        fields = dict(ln.split(": ", 1) for ln in info.splitlines() if ": " in ln)
        text = fields.get("Subject", "").strip() + "\n\n" + msg.read_text()
        _replace_worktree(repo, tree)
        env = {
            "GIT_AUTHOR_NAME": fields.get("Author", ""),
            "GIT_AUTHOR_EMAIL": fields.get("Email", ""),
            "GIT_AUTHOR_DATE": fields.get("Date", ""),
            "GIT_COMMITTER_DATE": fields.get("Date", ""),
            **_COMMITTER,
        }
        _g(
            repo,
            "commit",
            "-q",
            "--allow-empty",
            "--no-verify",
            "--cleanup=strip",
            "-F",
            "-",
            env=env,
            input=text.encode(),
        )


def _seed_preimages(engine: Engine, repo: Path) -> None:
    """Hash the primary line's pre-image blobs in, so `git am -3` can merge on any line."""
    primary = engine.apply_line(engine.primary)
    for k, name in enumerate(engine.series.names, 1):
        patch = engine.series.patches.get(name)
        if patch is None or k - 1 >= len(primary.stages):
            continue
        for f in patch.files:
            data = primary.stages[k - 1].get(f.old_path or "")
            if data is not None:
                _g(repo, "hash-object", "-w", "--stdin", input=data)


def checkout(engine: Engine, line: Line | str, dest: Path, upto: int | None = None) -> int:
    """Make ``dest`` a repository with the base and the first ``upto`` patches; return the count."""
    line = engine.line(line)
    result = engine.apply_line(line)
    n = len(engine.series.names) if upto is None else upto
    if not 0 <= n <= len(engine.series.names):
        raise ToolError(f"--upto must be between 0 and {len(engine.series.names)}, not {n}")
    if n > result.final:
        failed = result.patches[result.final]
        raise ToolError(f"{failed.detail}\n{failed.hint}")
    if dest.exists() and any(dest.iterdir()):
        raise ToolError(f"{dest} exists and is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    _g(dest, "init", "-q")
    _g(dest, "config", "lepatch.line", line.name)
    if not git("config", "user.email", cwd=dest, check=False).strip():
        # why: `git am --continue` after resolving by hand needs an identity to commit with.
        _g(dest, "config", "user.name", TOOL_IDENT["GIT_COMMITTER_NAME"])
        _g(dest, "config", "user.email", TOOL_IDENT["GIT_COMMITTER_EMAIL"])
    _replace_worktree(dest, result.stage(0))
    _g(
        dest,
        "commit",
        "-q",
        "--no-verify",
        "-m",
        f"base: {line.name} ({line.version}) local_executor.py",
        env=TOOL_IDENT,
    )
    _g(dest, "tag", BASE_TAG)
    _seed_preimages(engine, dest)
    for k, name in enumerate(engine.series.names[:n], 1):
        patch_file = engine.layout.patches / name
        want = result.stage(k)
        try:
            _g(
                dest,
                "am",
                "-3",
                "--quiet",
                "--committer-date-is-author-date",
                str(patch_file),
                env=_COMMITTER,
            )
        except GitError:
            _g(dest, "am", "--abort", env=_COMMITTER)
            _commit_from_mail(dest, patch_file, want)
            continue
        if _tree_of(dest, "HEAD") != want:
            _replace_worktree(dest, want)
            _g(dest, "commit", "-q", "--amend", "--no-edit", "--no-verify", env=_author_env(dest))
    return n


@dataclass
class RefreshReport:
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _commits(repo: Path) -> list[str]:
    if (Path(_g(repo, "rev-parse", "--absolute-git-dir").strip()) / "rebase-apply").exists():
        raise ToolError(f"{repo}: a `git am` is in progress; finish it (git am --continue) first")
    try:
        _g(repo, "rev-parse", "--verify", "-q", BASE_TAG)
    except GitError:
        raise ToolError(
            f"{repo}: no {BASE_TAG} tag; make the repository with `python -m tools checkout`"
        ) from None
    return [c for c in _g(repo, "rev-list", "--reverse", f"{BASE_TAG}..HEAD").split() if c]


def _write_if_changed(path: Path, data: bytes, report: RefreshReport, root: Path) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    report.written.append(str(path.relative_to(root)) if path.is_relative_to(root) else str(path))


def _name_patches(old: list[str], old_subjects: dict[str, str], mails: list[tuple[str, Patch]]) -> list[str]:
    """Keep each commit's series name: by subject, else by position when that name is free."""
    by_subject = {s: n for n, s in old_subjects.items()}
    names: list[str | None] = [None] * len(mails)
    used: set[str] = set()
    for i, (_, p) in enumerate(mails):
        n = by_subject.get(p.subject)
        if n and n not in used:
            names[i] = n
            used.add(n)
    for i in range(len(mails)):
        if names[i] is None and i < len(old) and old[i] not in used:
            names[i] = old[i]
            used.add(old[i])
    for i, (generated, _) in enumerate(mails):
        if names[i] is None:
            slug = re.sub(r"^\d+-", "", generated)
            candidate = f"{i + 1:04d}-{slug}"
            while candidate in used:
                candidate = f"{i + 1:04d}-x-{slug}"
            names[i] = candidate
            used.add(candidate)
    return [n for n in names if n]


def refresh_primary(engine: Engine, repo: Path) -> RefreshReport:
    commits = _commits(repo)
    report = RefreshReport()
    layout = engine.layout
    with tempfile.TemporaryDirectory() as tmp:
        if commits:
            _g(repo, *FORMAT_PATCH, "-o", tmp, f"{BASE_TAG}..HEAD")
        files = sorted(Path(tmp).glob("*.patch"))
        mails = [(f.name, parse_patch(f.name, f.read_text(encoding="utf-8"))) for f in files]
        old = read_series_names(layout.series_file)
        old_subjects = {n: engine.series.patches[n].subject for n in old if n in engine.series.patches}
        names = _name_patches(old, old_subjects, mails)
        layout.patches.mkdir(parents=True, exist_ok=True)
        for name, f in zip(names, files, strict=True):
            _write_if_changed(layout.patches / name, f.read_bytes(), report, layout.root)
    for name in old:
        if name not in names and (layout.patches / name).exists():
            (layout.patches / name).unlink()
            report.removed.append(f"patches/{name}")
    if names != old:
        comments = []
        if layout.series_file.exists():
            for raw in layout.series_file.read_text().splitlines():
                if not raw.strip() or raw.lstrip().startswith("#"):
                    comments.append(raw)
                else:
                    break
        text = "\n".join([*comments, *names]) + "\n"
        _write_if_changed(layout.series_file, text.encode(), report, layout.root)
        if old:
            report.notes.append("the series changed: check resolutions with `nox -s apply`")
    return report


def _auto_result(
    engine: Engine, parent: Tree, patch_file: Path, patch: Patch, pre: Tree | None
) -> tuple[dict[str, bytes | None], set[str]]:
    """Per file the patch touches, what strict (else 3-way) apply makes of it (None: deleted),
    and the files neither applies to."""
    result: dict[str, bytes | None] = {}
    failed: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        _g(scratch, "init", "-q")
        _replace_worktree(scratch, parent)
        _g(scratch, "commit", "-q", "--allow-empty", "--no-verify", "-m", "parent", env=TOOL_IDENT)
        for path in patch.touched:
            include = f"--include={path}"
            applied = engine.try_apply(scratch, patch_file, include) is None
            if applied or engine.try_3way(scratch, patch, patch_file, pre, include) is None:
                result[path] = (scratch / path).read_bytes() if (scratch / path).exists() else None
                engine.reset(scratch)
            else:
                failed.add(path)
    return result, failed


def refresh_line(engine: Engine, line: Line, repo: Path) -> RefreshReport:
    commits = _commits(repo)
    names = engine.series.names
    report = RefreshReport()
    subjects = [_g(repo, "log", "-1", "--format=%s", c).strip() for c in commits]
    want = [engine.series.patches[n].subject for n in names if n in engine.series.patches]
    # why: a checkout of the first k patches (``port``, ``checkout --upto``) records those k; the
    # resolutions of the later patches stay as they are.
    if not subjects or subjects != want[: len(subjects)]:
        raise ToolError(
            f"{repo}: its commits are not the series or its first patches ({len(commits)} commits, "
            f"{len(names)} patches, or subjects differ); change the series on the primary line, refresh "
            "only records resolutions"
        )
    if len(commits) < len(names):
        report.notes.append(
            f"the checkout has patches 1-{len(commits)} of {len(names)}: only their resolutions were checked"
        )
    primary = engine.apply_line(engine.primary)
    statuses = [p.status for p in engine.apply_line(line).patches]
    res_dir = engine.layout.resolutions / line.name
    for k, (commit, name) in enumerate(zip(commits, names[: len(commits)], strict=True), 1):
        patch = engine.series.patches[name]
        if statuses[k - 1] in (engine_mod.UPSTREAM, engine_mod.NOT_APPLICABLE):
            continue  # the line's base carries it, or has none of its files: nothing to resolve
        parent, mine = _tree_of(repo, f"{commit}^"), _tree_of(repo, commit)
        changed = {p for p in set(parent) | set(mine) if parent.get(p) != mine.get(p)}
        pre = primary.stages[k - 1] if k - 1 < len(primary.stages) else None
        auto, failed = _auto_result(engine, parent, engine.layout.patches / name, patch, pre)
        need = sorted(
            p
            for p in changed | set(auto) | failed
            if p in failed or auto.get(p, parent.get(p)) != mine.get(p)
        )
        unexpressible = [p for p in need if p not in changed]
        if unexpressible:
            raise ToolError(
                f"{name} on {line.name}: {', '.join(unexpressible)} is left unchanged, which a resolution "
                "cannot express (a resolution replaces the patch's change to a file, it cannot drop it)"
            )
        target = res_dir / name
        if need:
            text = _g(repo, *FORMAT_PATCH, "--stdout", "-1", commit, "--", *need)
            marks = unreviewed(text)
            if marks:
                raise ToolError(
                    f"{name} on {line.name}: the commit still adds {len(marks)} place(s) left for review "
                    f"(first: {marks[0]!r}); fix them, `git -C {shlex.quote(str(repo))} commit -a --amend "
                    "--no-edit` (or rebase -i), then refresh again"
                )
            _write_if_changed(target, text.encode(), report, engine.layout.root)
        elif target.exists():
            target.unlink()
            report.removed.append(str(target.relative_to(engine.layout.root)))
    return report


def refresh(engine: Engine, repo: Path, line: Line | str | None = None) -> RefreshReport:
    recorded = git("config", "--get", "lepatch.line", cwd=repo, check=False, isolated=True).strip()
    chosen = engine.line(line or recorded or engine.primary.name)
    if recorded and chosen.name != recorded:
        raise ToolError(f"{repo} is a checkout of {recorded}, not {chosen.name}")
    if chosen == engine.primary:
        return refresh_primary(engine, repo)
    return refresh_line(engine, chosen, repo)


def _cmd_checkout(args: argparse.Namespace) -> int:
    engine = engine_mod.default_engine()
    n = checkout(engine, args.line, args.dir, args.upto)
    line = engine.line(args.line)
    print(f"{args.dir}: {line.name} ({line.version}) base + {n} patch(es), base tagged {BASE_TAG}")
    where = shlex.quote(str(args.dir))
    print(f"  edit with git (commit --amend, rebase -i {BASE_TAG}), then: python -m tools refresh {where}")
    return 0


def _cmd_refresh(args: argparse.Namespace) -> int:
    engine = engine_mod.default_engine()
    report = refresh(engine, args.dir, args.line)
    for p in report.written:
        print(f"wrote: {p}")
    for p in report.removed:
        print(f"removed: {p}")
    for n in report.notes:
        print(f"note: {n}")
    if not report.written and not report.removed:
        print("refresh: nothing changed")
    else:
        print("refresh: now run `nox -s apply -- --write` to regenerate the derived files")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("checkout", help="make a git repository with one commit per patch, for editing")
    c.add_argument(
        "--line", default="3.3", type=pins.line_arg, help="release line (default: the primary, 3.3)"
    )
    c.add_argument("--upto", type=int, help="only the first N patches")
    c.add_argument("dir", type=Path)
    c.set_defaults(func=_cmd_checkout)
    r = sub.add_parser("refresh", help="export a checkout's commits back to patches/ (or resolutions)")
    r.add_argument("--line", type=pins.line_arg, help="default: the line the checkout was made for")
    r.add_argument("dir", type=Path)
    r.set_defaults(func=_cmd_refresh)

"""Prepare one patch of the series as an upstream Airflow PR: a branch, a test run, a PR body.

``prepare`` makes a branch in the Airflow clone from its ``main`` with the patch as one
commit (``git am -3`` in a temporary worktree, so the clone's checkout is never touched),
the DEP-3 lines dropped from the message. A patch whose header says ``Significant: yes``
also gets ``airflow-core/newsfragments/<PR>.significant.rst`` in that commit. The patch's
test files are run there with plain pytest, first as Airflow would (its conftest), and if
Airflow's test environment is not installed, self-contained (``--noconftest``); the
outcome is reported either way. The PR body, following Airflow's PR template (what and
why, ``closes:``/``related:`` from the ``Bug:`` lines, how it was tested, the generative-AI
disclosure), goes to ``build/pr/<patch stem>.md``. Nothing is pushed and no PR is opened:
the report prints the commands for that.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tools import commitmsg, pins
from tools.errors import ToolError
from tools.gitcmd import GitError, git
from tools.layout import DEFAULT as LAYOUT
from tools.layout import Layout
from tools.series import read_series_names

GUIDELINES = "https://github.com/apache/airflow/blob/main/contributing-docs/05_pull_requests.rst"
GENAI_GUIDELINES = f"[the guidelines]({GUIDELINES}#gen-ai-assisted-contributions)"
NEWSFRAGMENTS = "airflow-core/newsfragments"
_FIXING = r"(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?)"

TEMPLATE_TAIL = f"""\
* Read the **[Pull Request Guidelines]({GUIDELINES}#pull-request-guidelines)** for more information. \
Note: commit author/co-author name and email in commits become permanently public when merged.
* For fundamental code changes, an Airflow Improvement Proposal \
([AIP](https://cwiki.apache.org/confluence/display/AIRFLOW/Airflow+Improvement+Proposals)) is needed.
* When adding dependency, check compliance with the \
[ASF 3rd Party License Policy](https://www.apache.org/legal/resolved.html#category-x).
* For significant user-facing changes create newsfragment: `{{pr_number}}.significant.rst`, in \
[airflow-core/newsfragments](https://github.com/apache/airflow/tree/main/airflow-core/newsfragments).
"""


class PrError(ToolError):
    """A refusal or failure; the clone is left as it was."""


@dataclass
class TestRun:
    ran: bool
    passed: bool
    command: str
    summary: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Prepared:
    patch: Path
    branch: str
    commit: str
    title: str
    body_path: Path
    tests: TestRun
    newsfragment: str | None


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def references(msg: commitmsg.Message) -> list[str]:
    """``closes:`` for a Bug the message says it fixes, ``related:`` for the others."""
    out: list[str] = []
    text = f"{msg.title}\n{msg.body}"
    for bug in msg.all("bug"):
        ref = commitmsg.issue_refs(bug)
        if ref is None:
            continue
        number = ref[1:] if ref.startswith("#") else None
        target = rf"(?:#{number}\b|issues/{number}\b)" if number else re.escape(ref)
        fixes = re.search(rf"\b{_FIXING}:?\s+(?:\S*?){target}", text, flags=re.I)
        line = f"{'closes' if fixes else 'related'}: {ref}"
        if line not in out:
            out.append(line)
    return out


def disclosure(generated_by: str | None) -> str:
    """Airflow's "Was generative AI tooling used to co-author this PR?" section."""
    head = (
        "##### Was generative AI tooling used to co-author this PR?\n\n"
        "<!--\n"
        "If generative AI tooling has been used in the process of authoring this PR, please\n"
        'change below checkbox to `[X]` followed by the name of the tool, uncomment the "Generated-by".\n'
        "-->\n\n"
    )
    if generated_by:
        return (
            head + f"- [X] Yes (please specify the tool below)\n\n"
            f"Generated-by: {generated_by} following {GENAI_GUIDELINES}\n"
        )
    return (
        head + "- [ ] Yes (please specify the tool below)\n\n"
        f"<!--\nGenerated-by: [Tool Name] following {GENAI_GUIDELINES}\n-->\n"
    )


def pr_body(
    msg: commitmsg.Message, tests: TestRun, generated_by: str | None, newsfragment: str | None
) -> str:
    parts = [msg.body.strip() or msg.title]
    if refs := references(msg):
        parts.append("\n".join(refs))
    tested = []
    if tests.ran:
        verdict = "passes" if tests.passed else "FAILS"
        tested.append(f"- `{tests.command}` {verdict}: {tests.summary}")
    else:
        tested.append(f"- Not run by the preparation tool: {tests.summary}")
    tested += [f"- {note}" for note in tests.notes]
    if newsfragment:
        tested.append(f"- Newsfragment: `{newsfragment}` (user-visible change)")
    parts.append("### How was this tested\n\n" + "\n".join(tested))
    parts.append("---\n\n" + disclosure(generated_by))
    parts.append("---\n\n" + TEMPLATE_TAIL)
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


class PrPreparer:
    """Makes the branch, runs the tests, writes the body; tests drive it directly."""

    def __init__(
        self,
        repo: Path,
        *,
        layout: Layout = LAYOUT,
        base: str = "main",
        python: Path | None = None,
        generated_by: str | None = None,
        out_dir: Path | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.repo = Path(repo).resolve()
        if not (self.repo / ".git").exists():
            raise PrError(f"{self.repo}: not a git clone (no .git)")
        self.layout = layout
        self.base = base
        self.python = python
        self.generated_by = generated_by
        self.out_dir = out_dir or layout.build / "pr"
        self.out = out or sys.stdout

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def g(self, *args: str, **kwargs: object) -> str:
        return git(*args, cwd=self.repo, **kwargs)  # type: ignore[arg-type]

    def find_patch(self, name: str) -> Path:
        """A patch of the series by file name, stem or number (``3``, ``0003``)."""
        series = read_series_names(self.layout.series_file)
        wanted = Path(name).name
        for entry in series:
            stem = entry.removesuffix(".patch")
            number = stem.split("-", 1)[0]
            if wanted in (entry, stem) or (
                wanted.isdigit() and number.isdigit() and int(wanted) == int(number)
            ):
                return self.layout.patches / entry
        raise PrError(f"{self.layout.series_file}: no patch {name!r} in the series")

    def resolve(self, ref: str) -> str:
        for candidate in (f"refs/heads/{ref}", f"refs/remotes/upstream/{ref}", f"refs/remotes/origin/{ref}"):
            sha = self.g("rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}", check=False).strip()
            if sha:
                return sha
        raise PrError(f"{self.repo}: no branch {ref!r} (looked in local, upstream/ and origin/)")

    def prepare(
        self, name: str, *, branch: str | None = None, force: bool = False, run_tests: bool = True
    ) -> Prepared:
        patch = self.find_patch(name)
        if not patch.is_file():
            raise PrError(f"{patch}: listed in the series but missing")
        stem = patch.name.removesuffix(".patch")
        branch = branch or re.sub(r"^\d+-", "", stem).lower()
        exists = self.g("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).strip()
        if exists and not force:
            raise PrError(f"{self.repo}: branch {branch} already exists; pass --force to make it again")
        if exists and self.g("symbolic-ref", "--quiet", "--short", "HEAD", check=False).strip() == branch:
            raise PrError(f"{self.repo}: branch {branch} is checked out; switch away before --force")
        base_sha = self.resolve(self.base)
        with tempfile.TemporaryDirectory(prefix="lepatch-pr-") as tmp:
            wt = Path(tmp) / "wt"
            self.g("worktree", "add", "--detach", str(wt), base_sha)
            try:
                return self._prepare_in(wt, patch, stem, branch, base_sha, exists, run_tests)
            finally:
                self.g("worktree", "remove", "--force", str(wt), check=False)
                self.g("worktree", "prune", check=False)

    def _prepare_in(
        self, wt: Path, patch: Path, stem: str, branch: str, base_sha: str, exists: str, run_tests: bool
    ) -> Prepared:
        try:
            try:
                git("am", "-3", str(patch), cwd=wt)
            except GitError:
                # The patch's preimage blobs come from the stage before it; if main lacks the
                # earlier patches, 3-way has no ancestor. Make those blobs exist and retry.
                git("am", "--abort", cwd=wt, check=False)
                if not self._seed_preimages(wt, patch, base_sha):
                    raise
                git("am", "-3", str(patch), cwd=wt)
        except GitError as exc:
            git("am", "--abort", cwd=wt, check=False)
            where = [
                ln.strip()
                for ln in (exc.stdout + exc.stderr).splitlines()
                if ln.startswith(("CONFLICT", "error: patch failed", "error: "))
                and "could not build fake" not in ln
            ]
            earlier = read_series_names(self.layout.series_file)
            earlier = earlier[: earlier.index(patch.name)] if patch.name in earlier else []
            hint = (
                f"; it builds on {', '.join(n.split('-', 1)[0] for n in earlier)} of the series: "
                "prepare and merge those first (nox -s pr -- --repo REPO N), or use --base with a branch "
                "that has them"
                if earlier
                else ""
            )
            raise PrError(
                f"{patch}: does not apply to {self.base} ({base_sha[:10]}) even with 3-way merge: "
                f"{where[0] if where else _last_line(exc.stderr)}{hint}"
            ) from exc
        original = git("log", "-1", "--format=%B", cwd=wt)
        msg = commitmsg.parse(original)
        generated_by = self.generated_by
        if not generated_by and (m := re.search(r"^Generated-by:\s*(.+)$", original, flags=re.M)):
            generated_by = m.group(1).strip()
        message = msg.title + (f"\n\n{msg.body}" if msg.body else "") + "\n"
        newsfragment = None
        if msg.significant:
            number = msg.pr_number or next(
                (int(r[1:]) for r in map(commitmsg.issue_refs, msg.all("bug")) if r and r.startswith("#")),
                None,
            )
            if number is None:
                raise PrError(f"{patch}: Significant: yes but no PR or issue number to name the newsfragment")
            newsfragment = f"{NEWSFRAGMENTS}/{number}.significant.rst"
            text = msg.title + "\n\n" + (msg.body.split("\n\n")[0] if msg.body else msg.title) + "\n"
            (wt / newsfragment).parent.mkdir(parents=True, exist_ok=True)
            (wt / newsfragment).write_text(text)
            git("add", newsfragment, cwd=wt)
        git("commit", "--amend", "--quiet", "--no-verify", "-m", message, cwd=wt)
        commit = git("rev-parse", "HEAD", cwd=wt).strip()
        tests = self.run_tests(wt, commit) if run_tests else TestRun(False, False, "", "skipped (--no-test)")
        self.g("branch", "--force" if exists else "--no-track", branch, commit)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        body_path = self.out_dir / f"{stem}.md"
        body_path.write_text(pr_body(msg, tests, generated_by, newsfragment))
        result = Prepared(patch, branch, commit, msg.title, body_path, tests, newsfragment)
        self.report(result, generated_by)
        return result

    def _seed_preimages(self, wt: Path, patch: Path, base_sha: str) -> bool:
        """Apply the patches before ``patch`` (objects only), then go back to ``base_sha``."""
        earlier = []
        for name in read_series_names(self.layout.series_file):
            if name == patch.name:
                break
            earlier.append(self.layout.patches / name)
        if not earlier:
            return False
        for path in earlier:
            try:
                git("am", "-3", "--quiet", str(path), cwd=wt)
            except GitError:
                git("am", "--abort", cwd=wt, check=False)
                break
        git("reset", "--hard", "--quiet", base_sha, cwd=wt)
        return True

    def test_files(self, wt: Path, commit: str) -> list[str]:
        changed = git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=wt).split()
        return [
            f
            for f in changed
            if "/tests/" in f"/{f}" and Path(f).name.startswith("test_") and f.endswith(".py")
        ]

    def run_tests(self, wt: Path, commit: str) -> TestRun:
        files = self.test_files(wt, commit)
        if not files:
            return TestRun(False, False, "", "the patch adds or changes no test files")
        notes = []
        python = self.python
        if python is None:
            try:
                from tools import venvs  # the engine's venv helper: a pinned 3.3 env

                python = Path(venvs.ensure(pins.PRIMARY))
                venvs.install_executor(python, (wt / pins.REPO_PATH).read_bytes())
                notes.append(
                    f"apache-airflow-core {pins.PRIMARY.version} with this branch's `local_executor.py`, "
                    "no database"
                )
            except ImportError:
                return TestRun(
                    False, False, "", "no test environment: pass --python (tools.venvs is missing)"
                )
            except Exception as exc:
                return TestRun(False, False, "", f"could not set up the 3.3 test environment: {exc}")
        command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
        shown = "python -m pytest " + " ".join(files)
        env = None
        if self.python is None:
            from tools import venvs

            env = venvs.test_env(wt / ".lepatch-airflow-home")
            env.pop("PYTHONPATH", None)  # the clone's tests, not this project's
        proc = subprocess.run(command, cwd=wt, env=env, capture_output=True, text=True)
        if proc.returncode in (2, 3, 4):  # collection or conftest import failed: Airflow's test env is absent
            notes.append(
                f"with Airflow's conftest it cannot run here "
                f"({_last_line(proc.stdout + proc.stderr)[:160]}); "
                "run self-contained instead"
            )
            command.insert(4, "--noconftest")
            shown = "python -m pytest --noconftest " + " ".join(files)
            proc = subprocess.run(command, cwd=wt, env=env, capture_output=True, text=True)
        summary = _last_line(proc.stdout).strip("= ") or _last_line(proc.stderr)
        if proc.returncode == 5:
            return TestRun(False, False, shown, f"no tests collected from {', '.join(files)}", notes)
        if proc.returncode in (2, 3, 4):
            return TestRun(False, False, shown, f"cannot run here: {summary[:200]}", notes)
        return TestRun(True, proc.returncode == 0, shown, summary, notes)

    def report(self, p: Prepared, generated_by: str | None) -> None:
        repo = shlex.quote(str(self.repo))
        self.say(f"branch {p.branch} at {p.commit[:10]} in {self.repo}: {p.title}")
        if p.newsfragment:
            self.say(f"newsfragment {p.newsfragment} added to the commit")
        if p.tests.ran:
            self.say(
                f"tests {'passed' if p.tests.passed else 'FAILED'}: {p.tests.command}: {p.tests.summary}"
            )
        else:
            self.say(f"tests NOT RUN: {p.tests.summary}")
        for note in p.tests.notes:
            self.say(f"  {note}")
        self.say(f"PR body: {p.body_path}")
        if not generated_by:
            self.say(
                "note: the generative-AI disclosure is left unticked; "
                "pass --generated-by TOOL if one was used"
            )
        self.say("nothing pushed; when ready:")
        self.say(f"  git -C {repo} push <your fork> {p.branch}")
        self.say(
            f"  gh pr create --repo apache/airflow --base {self.base} --head <you>:{p.branch} "
            f"--title {shlex.quote(p.title)} --body-file {shlex.quote(str(p.body_path))}"
        )


# -------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("patch", help="a patch of the series: file name, stem or number (3)")
    parser.add_argument("--repo", type=Path, required=True, help="the Airflow git clone")
    parser.add_argument("--base", default="main", help="branch to start from (default: main)")
    parser.add_argument("--branch", help="name of the branch to make (default: the patch's stem)")
    parser.add_argument("--force", action="store_true", help="replace the branch if it exists")
    parser.add_argument("--python", type=Path, help="run the tests with this interpreter as it is")
    parser.add_argument("--no-test", dest="run_tests", action="store_false", help="skip the test run")
    parser.add_argument("--generated-by", help="tick the generative-AI disclosure, naming the tool")
    parser.add_argument(
        "--patches", type=Path, default=None, help="the patches directory (default: patches/)"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where the PR body goes (default: build/pr)"
    )


def run(args: argparse.Namespace) -> int:
    layout = Layout(patches_dir=args.patches.resolve()) if args.patches else LAYOUT
    try:
        prep = PrPreparer(
            args.repo,
            layout=layout,
            base=args.base,
            python=args.python,
            generated_by=args.generated_by,
            out_dir=args.out_dir,
        )
        result = prep.prepare(args.patch, branch=args.branch, force=args.force, run_tests=args.run_tests)
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 1 if result.tests.ran and not result.tests.passed else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pr", help="prepare one patch as an upstream Airflow PR (branch, tests, PR body)")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools pr", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

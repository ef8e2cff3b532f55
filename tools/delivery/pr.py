"""Prepare one patch of the series as an upstream Airflow PR: a branch, a test run, a PR body.

Upstream's ``main`` is the pre-release line (3.4), which ships the first patches of the series
already. ``prepare`` makes a branch in the Airflow clone with one commit, in a temporary
worktree (the clone's checkout is never touched), the DEP-3 lines dropped from the message:

- a plain patch: its own change on the 3.4 line (the engine's stage k-1 -> k), on ``main``;
- ``PR-Folds: 0004, 0005, 0006``: the series' change from the last stage upstream has to
  this patch's stage, so code the folded patches add and this one removes never appears
  (their authors become ``Co-authored-by:``);
- ``PR-Stack-On: 0007``: one commit on top of that patch's PR branch (prepared first if it is
  missing), the change from its stage to this one. Patches in between that are neither folded
  nor upstream are PRs of their own (on ``main``): left out when they share no file with this
  patch's own change (12 stacks on 9 without 10 and 11), else named as missing.

Test files that the PR's tests edit or need and ``main`` lacks (those of the upstream patches
come with the series' stages, not with upstream) are added whole. A patch whose header says
``Significant: yes`` also gets ``airflow-core/newsfragments/<PR>.significant.rst``. The PR's
test files run in the 3.4 line's venv with the branch's ``local_executor.py`` installed,
first as Airflow would (its conftest), and if Airflow's test environment is not installed,
self-contained (``--confcutdir`` at the test directory); the outcome is reported either way.

``prepare_standalone`` (``--standalone N``) does the same for a patch of ``patches/upstream-prs/``
(``tools.delivery.upstream_prs``): a fix written against the 3.4 line's release as it is, independent of
the series, applied to ``main`` as one commit; its tests run with the branch's executor and, with
``main``'s, each of its ``Regression-Test:`` ids must fail: the body shows both runs.

The PR body follows Airflow's PR template (what and why, ``closes:``/``related:`` from the
``Bug:`` lines, how it was tested, the generative-AI disclosure) and adds what the commit
contains, every upstream test that uses an internal the PR removes (``tools.delivery.pr_internals``;
upstream's ``test_local_executor.py`` aside) and a generated "How this was verified"
(``tools.delivery.pr_evidence``). Where the branch holds upstream's ``test_local_executor.py``, the
commit carries the PR's diff to it (``patches/upstream-tests/<stem>.diff``, and those of the patches
it folds), the test run adds that whole file (``tools.delivery.upstream_tests``), and the body a table
"Upstream's test_local_executor.py in this PR": each test the diff changes, what and why, what now
covers it, and the whole file's pass/fail count on the branch. It goes to
``build/pr/<patch stem>.md``. Nothing is pushed and no PR is opened: the report prints the
commands for that. Where no Airflow clone is at hand, ``--make-clone DIR`` makes a stand-in whose
``main`` is the 3.4 line's pinned files (``tools.delivery.pr_clone``).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tools.delivery import lineform, pr_clone, pr_evidence, pr_internals, upstream_prs, upstream_tests
from tools.delivery.pr_testrun import TestRun, last_line, run_test_files
from tools.delivery.wheels import interpreter_problem
from tools.engine.series import Patch, read_patch, read_series_names
from tools.shared import commitmsg, pins
from tools.shared.errors import ToolError
from tools.shared.gitcmd import GitError, git, identity_problem
from tools.shared.layout import DEFAULT as LAYOUT
from tools.shared.layout import REPO_TESTS_DIR, Layout

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
class Plan:
    """What the PR's one commit is: the series' change on the base line from ``start`` to ``end``."""

    patch: Path
    line: pins.Line
    start: int  # stage the PR starts from (what the base, or the stacked-on branch, has)
    end: int  # the patch's own stage
    folds: list[str]  # earlier patches folded in (file names)
    stack_on: str | None  # patch whose PR branch this one is stacked on
    upstream: list[str]  # patches already in the base line's release
    # Patches between the stacked-on one and this one that are PRs of their own, on other branches:
    # this commit changes none of their files, so it leaves them out.
    skipped: list[str] = field(default_factory=list)


@dataclass
class Prepared:
    patch: Path
    branch: str
    commit: str
    title: str
    body_path: Path
    tests: TestRun
    newsfragment: str | None
    plan: Plan | None = None
    findings: list[pr_internals.Finding] = field(default_factory=list)
    removed: list[pr_internals.Removed] = field(default_factory=list)
    stacked_branch: str | None = None
    upstream_records: list[upstream_tests.Record] = field(default_factory=list)
    upstream_outcome: upstream_tests.Outcome | None = None


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


def pr_folds(patch: Patch) -> str | None:
    """``PR-Folds:`` (also read as ``PR-Fold``/``PR-Folds-In``): earlier patches folded into this PR."""
    return next((patch.field(k) for k in ("PR-Folds", "PR-Fold", "PR-Folds-In") if patch.field(k)), None)


def pr_stack_on(patch: Patch) -> str | None:
    """``PR-Stack-On:`` (also ``PR-Stacked-On``): the patch whose PR branch this one stacks on."""
    return next((patch.field(k) for k in ("PR-Stack-On", "PR-Stacked-On") if patch.field(k)), None)


def default_branch(patch: Path) -> str:
    return re.sub(r"^\d+-", "", patch.name.removesuffix(".patch")).lower()


def _title(layout: Layout, name: str) -> str:
    return read_patch(layout.patches / name).subject


def contents_section(plan: Plan, layout: Layout, stacked: str | None, whole: Sequence[str] = ()) -> str:
    """What the PR's one commit is, in the series' terms."""
    number = plan.patch.name.split("-", 1)[0]
    line = f"the {plan.line.name} line ({plan.line.version})"
    out = ["### What this PR contains", ""]
    if plan.stack_on is not None:
        out.append(
            f"Stacked on `{stacked}`, the PR of {plan.stack_on.split('-', 1)[0]} "
            f'"{_title(layout, plan.stack_on)}": review and merge that first. This PR adds one commit on '
            f"top of it: the series' change on {line} from stage {plan.start} to stage {plan.end} "
            f"({number} alone)."
        )
        if plan.skipped:
            names = ", ".join(n.split("-", 1)[0] for n in plan.skipped)
            out.append(
                f"Patches {names} of the series, between the two, are PRs of their own and are not on "
                "this branch: this commit changes none of their files."
            )
    else:
        out.append(f"One commit: the series' change on {line} from stage {plan.start} to stage {plan.end}.")
    if plan.folds:
        out += [
            "",
            "It folds in the earlier patches of the series that were never proposed on their own, so "
            "code they add and this change removes again never appears:",
            "",
        ]
        out += [f'- {f.split("-", 1)[0]} "{_title(layout, f)}"' for f in plan.folds]
    if whole:
        out.append("")
        out.append(
            "Test files of earlier patches of the series that this PR's tests edit or need, and that "
            f"`{plan.line.branch}` does not have, come along whole: "
            + ", ".join(sorted(f"`{p.rsplit('/', 1)[-1]}`" for p in whole))
            + "."
        )
    if plan.upstream:
        out.append("")
        names = ", ".join(n.split("-", 1)[0] for n in plan.upstream)
        many = len(plan.upstream) > 1
        out.append(
            f"{'Patches' if many else 'Patch'} {names} of the series {'are' if many else 'is'} upstream "
            f"already (in {plan.line.version})."
        )
    return "\n".join(out)


def pr_body(
    msg: commitmsg.Message,
    tests: TestRun,
    generated_by: str | None,
    newsfragment: str | None,
    sections: list[str] | None = None,
    verified: str | None = None,
) -> str:
    # why: the disclosure below carries the one Generated-by line (--generated-by or the patch's).
    body = re.sub(r"\n{3,}", "\n\n", re.sub(r"^Generated-by:.*(?:\n|$)", "", msg.body, flags=re.M))
    parts = [body.strip() or msg.title]
    if refs := references(msg):
        parts.append("\n".join(refs))
    parts += sections or []
    if tests.ran:
        tested = [f"- `{tests.command}` {'passes' if tests.passed else 'FAILS'}: {tests.summary}"]
    else:
        tested = [f"- Not run by the preparation tool: {tests.summary}"]
    tested += [f"- {note}" for note in tests.notes]
    if newsfragment:
        tested.append(f"- Newsfragment: `{newsfragment}` (user-visible change)")
    parts.append("### How was this tested\n\n" + "\n".join(tested))
    if verified:
        parts.append(verified)
    parts.append("---\n\n" + disclosure(generated_by))
    parts.append("---\n\n" + TEMPLATE_TAIL)
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def without_the_fix(run: TestRun, regression: Sequence[str], base: str, line: pins.Line) -> str:
    """One line for the body: the PR's tests on the base's executor, where its Regression-Tests fail."""
    where = f"on `{base}` ({line.version}) without the fix"
    if not run.ran:
        return f"{where}: not run: {run.summary}"
    names = ", ".join(f"`{t.rsplit('::', 1)[-1]}`" for t in regression) or "(no Regression-Test named)"
    missing = [t for t in regression if t not in run.failed]
    if run.returncode == 1 and not missing:
        others = [t for t in run.failed if t not in regression]
        also = f"; also failed: {', '.join(f'`{t}`' for t in others)}" if others else ""
        return f"{where}, `{run.command}` fails as it should: {run.summary} ({names} failed{also})"
    return f"{where}, `{run.command}` did NOT fail as expected: {run.summary}" + (
        f" ({', '.join(f'`{t}`' for t in missing)} did not fail)" if missing else ""
    )


def standalone_contents(line: pins.Line, base: str, regression: Sequence[str]) -> str:
    tests = ", ".join(f"`{t.rsplit('/', 1)[-1]}`" for t in regression)
    return (
        "### What this PR contains\n\n"
        f"One commit on `{base}` ({line.version}): the fix and the test that shows the bug "
        f"({tests}), in the executor's current design. It fixes this one bug only and depends on no "
        "other change."
    )


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
        evidence_dir: Path | None = None,
        equivalents: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.repo = Path(repo).resolve()
        if not (self.repo / ".git").exists():
            what = "not a git clone (no .git)" if self.repo.is_dir() else "no such directory"
            raise PrError(f"{self.repo}: {what}; --repo takes {lineform.AIRFLOW_CLONE}")
        if python is not None and (problem := interpreter_problem(Path(python))):
            raise PrError(problem)
        self.layout = layout
        self.base = base
        self.python = python
        self.generated_by = generated_by
        self.out_dir = out_dir or layout.build / "pr"
        self.out = out or sys.stdout
        self.evidence_dir = evidence_dir or layout.build  # verify.json, chaos/<line>.json
        self.equivalents = pr_internals.EQUIVALENTS if equivalents is None else equivalents

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def g(self, *args: str, **kwargs: object) -> str:
        return git(*args, cwd=self.repo, **kwargs)  # type: ignore[arg-type]

    def find_patch(self, name: str) -> Path:
        """A patch of the series by file name, stem or number (``3``, ``0003``)."""
        if entry := upstream_prs.match(read_series_names(self.layout.series_file), name):
            return self.layout.patches / entry
        raise PrError(f"{self.layout.series_file}: no patch {name!r} in the series")

    def resolve(self, ref: str) -> str:
        for candidate in (f"refs/heads/{ref}", f"refs/remotes/upstream/{ref}", f"refs/remotes/origin/{ref}"):
            if sha := self.rev(candidate):
                return sha
        raise PrError(
            f"{self.repo}: no branch {ref!r} (looked in local, upstream/ and origin/); "
            f"--repo takes {lineform.AIRFLOW_CLONE}"
        )

    def rev(self, ref: str) -> str:
        return self.g("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip()

    def refs(self, value: str | None, patch: Path) -> list[str]:
        """Patch file names from a header value such as ``0004, 0005`` (numbers, stems or names)."""
        out = []
        for token in re.split(r"[\s,;]+", value or ""):
            if token:
                try:
                    out.append(self.find_patch(token).name)
                except PrError:
                    raise PrError(f"{patch}: names {token!r}, which is not a patch of the series") from None
        return out

    def plan(self, patch: Path) -> Plan:
        """The stages the PR spans on the base's line, from the patch's PR-Folds / PR-Stack-On."""
        line = lineform.base_line(self.base)
        form = lineform.line_form(line, self.layout)
        k = form.index(patch.name)
        if form.has_stage(k) and form.is_upstream(k):
            raise PrError(
                f"{patch}: already upstream in {line.version} ({self.base}): there is nothing to propose"
            )
        if not form.has_stage(k):
            failed = next((d for d in form.details[:k] if d), "an earlier patch failed")
            raise PrError(
                f"{patch}: the series does not reach it on the {line.name} line ({failed}); "
                f"python -m tools apply --line {line.name}"
            )
        header = read_patch(patch)
        folds = self.refs(pr_folds(header), patch)
        stacks = self.refs(pr_stack_on(header), patch)
        if len(stacks) > 1:
            raise PrError(f"{patch}: PR-Stack-On names {len(stacks)} patches; a branch stacks on one")
        stack_on = stacks[0] if stacks else None
        own = min(form.index(f) for f in folds) - 1 if folds else k - 1
        start = form.index(stack_on) if stack_on is not None else own
        if start >= k or any(form.index(f) >= k for f in folds):
            raise PrError(f"{patch}: PR-Folds and PR-Stack-On may only name earlier patches of the series")
        between = [form.names[i - 1] for i in range(start + 1, k)]
        missing = [n for n in between if n not in folds and not form.is_upstream(form.index(n))]

        def needed(name: str) -> bool:
            """Whether this PR cannot leave ``name`` out: a stacked PR leaves out a patch between the
            stacked-on one and its own change (a PR of its own, on main) that shares no file with it."""
            i = form.index(name)
            if stack_on is None or i > own:
                return True
            return bool(set(form.change(i - 1, i)) & set(form.change(own, k)))

        if needing := [n for n in missing if needed(n)]:
            raise PrError(
                f"{patch}: its PR would span stages {start}..{k} but PR-Folds does not name "
                f"{', '.join(n.split('-', 1)[0] for n in needing)}"
            )
        if missing:
            start = own
        pending = [form.names[i - 1] for i in range(1, start + 1) if not form.is_upstream(i)]
        if folds and stack_on is None and pending:
            raise PrError(
                f"{patch}: PR-Folds starts at stage {start}, but "
                f"{', '.join(n.split('-', 1)[0] for n in pending)} before it are not upstream in "
                f"{line.version}: fold them too, or stack on their PR (PR-Stack-On)"
            )
        upstream = [form.names[i - 1] for i in range(1, k) if form.is_upstream(i)]
        return Plan(patch, line, start, k, [f for f in between if f in folds], stack_on, upstream, missing)

    def free_branch(self, branch: str, force: bool) -> str:
        """The branch's commit if it exists (and may be replaced), else ""; refuse otherwise."""
        exists = self.rev(f"refs/heads/{branch}")
        if exists and not force:
            raise PrError(f"{self.repo}: branch {branch} already exists; pass --force to make it again")
        if exists and self.g("symbolic-ref", "--quiet", "--short", "HEAD", check=False).strip() == branch:
            raise PrError(f"{self.repo}: branch {branch} is checked out; switch away before --force")
        # why: checked first, else a foreign repo or a missing git identity reads as "does not apply".
        if problem := lineform.not_airflow(self.repo, self.resolve(self.base), self.base):
            raise PrError(problem)
        if problem := identity_problem(self.repo):
            raise PrError(problem)
        return exists

    def prepare(
        self, name: str, *, branch: str | None = None, force: bool = False, run_tests: bool = True
    ) -> Prepared:
        patch = self.find_patch(name)
        if not patch.is_file():
            raise PrError(f"{patch}: listed in the series but missing")
        stem = patch.name.removesuffix(".patch")
        branch = branch or default_branch(patch)
        exists = self.free_branch(branch, force)
        plan = self.plan(patch)
        stacked = None
        if plan.stack_on is not None:
            stacked = default_branch(self.layout.patches / plan.stack_on)
            if not self.rev(f"refs/heads/{stacked}"):
                self.say(f"{patch.name} stacks on {plan.stack_on}: preparing its branch {stacked} first")
                self.prepare(plan.stack_on, run_tests=run_tests)
                self.say("")
            base_sha = self.rev(f"refs/heads/{stacked}")
        else:
            base_sha = self.resolve(self.base)
        with lineform.temp_worktree(self.repo, base_sha, "lepatch-pr-") as wt:
            return self._prepare_in(wt, plan, stem, branch, base_sha, exists, run_tests, stacked)

    def _prepare_in(
        self,
        wt: Path,
        plan: Plan,
        stem: str,
        branch: str,
        base_sha: str,
        exists: str,
        run_tests: bool,
        stacked: str | None,
    ) -> Prepared:
        patch = plan.patch
        form = lineform.line_form(plan.line, self.layout)
        header = read_patch(patch)
        msg, message, generated_by = self._message(header)
        coauthors = []
        for name in plan.folds:
            author = read_patch(self.layout.patches / name).author
            if author and author != header.author and author not in coauthors:
                coauthors.append(author)
        if coauthors:  # into the message's trailer block if it ends with one
            last = message.rstrip("\n").rsplit("\n\n", 1)[-1].splitlines()
            joined = all(re.match(r"^[\w-]+: ", ln) for ln in last) and len(message.split("\n\n")) > 1
            message = message.rstrip("\n") + ("\n" if joined else "\n\n")
            message += "".join(f"Co-authored-by: {a}\n" for a in coauthors)
        start_tree = form.stage(plan.start)
        change = form.change(plan.start, plan.end)
        # Test support files come along only for the test directories this PR's own tests are in
        # (a supervisor PR needs none of the executor tests' harness).
        for tests_dir in [f.repo_tests_dir for f in pins.UPSTREAM_FILES]:
            if any(p.startswith(tests_dir + "/") for p in change):
                change = lineform.self_contained(
                    change,
                    form.stage(plan.end),
                    lambda p: lineform.has_path(self.repo, base_sha, p),
                    tests_dir,
                )
        carrier = lineform.overlay_commit(
            self.repo, base_sha, change, message, author=header.author, date=header.date
        )
        try:
            git("cherry-pick", "--allow-empty", carrier, cwd=wt)
        except GitError as exc:
            git("cherry-pick", "--abort", cwd=wt, check=False)
            pending = [n for n in form.names[: plan.start] if n not in plan.upstream]
            hint = (
                f"; it builds on {', '.join(n.split('-', 1)[0] for n in pending)} of the series, not "
                f"upstream in {plan.line.version}: fold them in (PR-Folds:) or stack on their PR "
                "(PR-Stack-On:), or use --base with a branch that has them"
                if pending
                else ""
            )
            onto = stacked or self.base
            raise PrError(
                f"{patch}: does not apply to {onto} ({base_sha[:10]}) even with 3-way merge: "
                f"{lineform.conflict_line(exc) or last_line(exc.stderr)}{hint}"
            ) from exc
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
        records, upstream_note = self.upstream_test_diffs(wt, plan)
        git("commit", "--amend", "--quiet", "--no-verify", "--allow-empty", "-m", message, cwd=wt)
        commit = git("rev-parse", "HEAD", cwd=wt).strip()
        removed, found, scanned = self.internals(wt, commit, plan, form)
        tests = (
            self.run_tests(wt, commit, plan.line)
            if run_tests
            else TestRun(False, False, "", "skipped (--no-test)")
        )
        outcome = None
        if upstream_note is None and run_tests:
            outcome = self.run_upstream_file(wt, plan.line)
            tests.notes.append(
                f"upstream's `{upstream_tests.REPO_FILE}`, the whole file with this branch's executor "
                f"(stand-ins for `tests_common`, no database): {outcome.summary()}"
            )
            if not outcome.passed:
                tests.passed = False
        self.g("branch", "--force" if exists else "--no-track", branch, commit)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        body_path = self.out_dir / f"{stem}.md"
        whole = [p for p, (a, _) in change.items() if a is None and p in start_tree]
        sections = [
            contents_section(plan, self.layout, stacked, whole),
            pr_internals.render(removed, found, scanned, REPO_TESTS_DIR),
        ]
        if upstream_note != "absent":
            sections.append(
                upstream_tests.render_table(
                    records, outcome, upstream_note or ("" if run_tests else "--no-test")
                )
            )
        verified = pr_evidence.section(
            self.evidence_dir, [*plan.folds, patch.name], plan.line.name, plan.end, pins.PRIMARY.name
        )
        body_path.write_text(pr_body(msg, tests, generated_by, newsfragment, sections, verified))
        result = Prepared(
            patch, branch, commit, msg.title, body_path, tests, newsfragment, plan, found, removed, stacked,
            records, outcome,
        )  # fmt: skip
        self.report(result, generated_by)
        return result

    def upstream_test_diffs(self, wt: Path, plan: Plan) -> tuple[list[upstream_tests.Record], str | None]:
        """Apply this PR's diffs to upstream's ``test_local_executor.py`` (``patches/upstream-tests/``:
        its own and its folded patches') where the branch holds that file, and stage it.

        Returns the records of what changed, and None, or a note why nothing was done: "absent" (the
        branch has no such file) or why the diffs do not apply."""
        target = wt / upstream_tests.REPO_FILE
        if not target.is_file():
            return [], "absent"
        diffs = upstream_tests.existing_diffs(self.layout, [*plan.folds, plan.patch.name])
        records: list[upstream_tests.Record] = []
        for diff in diffs:
            try:
                git("apply", "--whitespace=nowarn", str(diff.resolve()), cwd=wt, isolated=True)
            except GitError as exc:
                git("checkout", "--", upstream_tests.REPO_FILE, cwd=wt, check=False)
                return [], (
                    f"`patches/{upstream_tests.DIFFS_DIR}/{diff.name}` does not apply to the branch's file "
                    f"({last_line(exc.stderr)}): upstream's file changed since the diff was made"
                )
            records += upstream_tests.parse_records(diff.read_text(), diff.name)[0]
        if diffs:
            git("add", upstream_tests.REPO_FILE, cwd=wt)
        return records, None

    def run_upstream_file(self, wt: Path, line: pins.Line) -> upstream_tests.Outcome:
        """Upstream's whole ``test_local_executor.py`` as the branch has it, with the branch's executor."""
        text = (wt / upstream_tests.REPO_FILE).read_text()
        try:
            python = self.python
            if python is None:
                from tools.engine import venvs

                python = Path(venvs.ensure(line, self.layout, upstream_tests=True))
                branch_files = [f for f in pins.UPSTREAM_FILES if (wt / f.repo_path).is_file()]
                venvs.install_sources(
                    python, {f.package_path: (wt / f.repo_path).read_bytes() for f in branch_files}
                )
        except Exception as exc:
            return upstream_tests.Outcome("", {}, [], None, f"no test environment: {exc}")
        return upstream_tests.run_text(text, python, layout=self.layout)

    def internals(
        self, wt: Path, commit: str, plan: Plan, form: lineform.LineForm
    ) -> tuple[list[pr_internals.Removed], list[pr_internals.Finding], int]:
        """What the PR removes, and every use of it in the clone's tests outside the PR."""
        end = form.stage(plan.end)
        return self.internals_between(
            wt,
            commit,
            plan.patch,
            form.stage(plan.start).get(pins.REPO_PATH, b""),
            end.get(pins.REPO_PATH, b""),
            {p: d for p, d in end.items() if p.startswith(REPO_TESTS_DIR + "/")},
            # Upstream's test_local_executor.py gets the PR's own diff and table (upstream_tests) instead.
            skip=[upstream_tests.REPO_FILE] if (wt / upstream_tests.REPO_FILE).is_file() else [],
        )

    def internals_between(
        self,
        wt: Path,
        commit: str,
        patch: Path,
        before: bytes,
        after: bytes,
        our_test_files: Mapping[str, bytes],
        skip: Sequence[str] = (),
    ) -> tuple[list[pr_internals.Removed], list[pr_internals.Finding], int]:
        """What going from executor ``before`` to ``after`` removes, and its uses in the clone's tests
        outside the commit (``our_test_files``: the PR's own tests, for equivalents; ``skip``: files
        left out of the scan)."""
        try:
            removed = pr_internals.removed_internals(
                before.decode("utf-8", "replace"), after.decode("utf-8", "replace")
            )
        except (SyntaxError, ValueError) as exc:
            raise PrError(f"{patch}: cannot read the executor it produces: {exc}") from exc
        ours = set(git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=wt).split())
        listed = git("ls-files", "-z", "--", f"{pr_internals.TESTS_ROOT}*.py", cwd=wt).split("\0")
        files = {
            rel: (wt / rel).read_bytes()
            for rel in listed
            if rel and rel not in ours and not rel.startswith(REPO_TESTS_DIR + "/") and rel not in skip
        }
        hits = pr_internals.scan_tests(files, {r.name for r in removed})
        our_tests = pr_internals.test_functions(dict(our_test_files))
        return removed, pr_internals.findings(removed, hits, our_tests, self.equivalents), len(files)

    def test_files(self, wt: Path, commit: str) -> list[str]:
        changed = git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=wt).split()
        return [
            f
            for f in changed
            if "/tests/" in f"/{f}"
            and Path(f).name.startswith("test_")
            and f.endswith(".py")
            and f != upstream_tests.REPO_FILE  # run whole, with its stand-ins: run_upstream_file()
        ]

    def run_tests(self, wt: Path, commit: str, line: pins.Line) -> TestRun:
        """The PR's test files, in the line's venv with the branch's executor installed."""
        return run_test_files(wt, self.test_files(wt, commit), line, self.python)

    # ------------------------------------------------------------ standalone PRs

    def prepare_standalone(
        self, name: str, *, branch: str | None = None, force: bool = False, run_tests: bool = True
    ) -> Prepared:
        """A patch of ``patches/upstream-prs/`` as one commit on the base branch
        (``tools.delivery.upstream_prs``).

        The patch is applied as it is (strict, no fuzz), its DEP-3 lines dropped from the message;
        its tests run with the branch's executor, and its Regression-Tests also with the base's,
        where they must fail: the body shows both runs."""
        try:
            patch = upstream_prs.find(self.layout, name)
        except upstream_prs.UpstreamPrError as exc:
            raise PrError(str(exc)) from None
        if not patch.is_file():
            raise PrError(f"{patch}: listed in {upstream_prs.LIST_NAME} but missing")
        branch = branch or default_branch(patch)
        exists = self.free_branch(branch, force)
        base_sha = self.resolve(self.base)
        line = lineform.line_of_branch(self.base) or upstream_prs.line()
        with lineform.temp_worktree(self.repo, base_sha, "lepatch-pr-") as wt:
            return self._standalone_in(wt, patch, line, branch, base_sha, exists, run_tests)

    def _message(self, header: Patch) -> tuple[commitmsg.Message, str, str | None]:
        """The patch's message parsed, the PR commit's message made of it, and its Generated-by:
        this run's, else the patch's own trailer."""
        original = lineform.patch_message(header)
        msg = commitmsg.parse(original)
        generated_by = self.generated_by
        if not generated_by and (m := re.search(r"^Generated-by:\s*(.+)$", original, flags=re.M)):
            generated_by = m.group(1).strip()
        return msg, msg.title + (f"\n\n{msg.body}" if msg.body else "") + "\n", generated_by

    def _standalone_in(
        self, wt: Path, patch: Path, line: pins.Line, branch: str, base_sha: str, exists: str, run_tests: bool
    ) -> Prepared:
        from tools.engine.apply import describe_apply_error

        header = read_patch(patch)
        msg, message, generated_by = self._message(header)
        try:
            git("apply", "--index", str(patch.resolve()), cwd=wt, isolated=True)
        except GitError as exc:
            raise PrError(
                f"{patch}: does not apply to {self.base} ({base_sha[:10]}): "
                f"{describe_apply_error(header, exc.stderr)}; it is written against {line.version}'s "
                f"{pins.REPO_PATH}"
            ) from exc
        env = lineform.ident_env(header.author, header.date)
        git("commit", "--quiet", "--no-verify", "-m", message, cwd=wt, env=env)
        commit = git("rev-parse", "HEAD", cwd=wt).strip()
        before = git("show", f"{base_sha}:{pins.REPO_PATH}", cwd=wt).encode("utf-8", "surrogateescape")
        after = (wt / pins.REPO_PATH).read_bytes()
        ours = {p: (wt / p).read_bytes() for p in upstream_prs.test_files(header) if (wt / p).is_file()}
        removed, found, scanned = self.internals_between(wt, commit, patch, before, after, ours)
        regression = upstream_prs.regression_tests(header)
        if run_tests:
            # Without the fix first: its tests on the base's executor, where each Regression-Test must fail.
            (wt / pins.REPO_PATH).write_bytes(before)
            try:
                unfixed = self.run_tests(wt, commit, line)
            finally:
                (wt / pins.REPO_PATH).write_bytes(after)
            tests = self.run_tests(wt, commit, line)
            tests.notes.insert(0, without_the_fix(unfixed, regression, self.base, line))
        else:
            tests = TestRun(False, False, "", "skipped (--no-test)")
        self.g("branch", "--force" if exists else "--no-track", branch, commit)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        body_path = self.out_dir / f"{patch.name.removesuffix('.patch')}.md"
        sections = [
            standalone_contents(line, self.base, regression),
            pr_internals.render(removed, found, scanned, REPO_TESTS_DIR),
        ]
        body_path.write_text(pr_body(msg, tests, generated_by, None, sections))
        result = Prepared(patch, branch, commit, msg.title, body_path, tests, None, None, found, removed)
        self.report(result, generated_by)
        return result

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
        if p.stacked_branch:
            self.say(
                f"stacked on {p.stacked_branch}: push both; open this PR once that one is merged "
                "(before, its diff against main shows both commits)"
            )
        self.say("nothing pushed; when ready:")
        self.say(f"  git -C {repo} push <your fork> {p.branch}")
        self.say(
            f"  gh pr create --repo apache/airflow --base {self.base} --head <you>:{p.branch} "
            f"--title {shlex.quote(p.title)} --body-file {shlex.quote(str(p.body_path))}"
        )


# -------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("patch", nargs="?", help="a patch of the series: file name, stem or number (3)")
    parser.add_argument(
        "--standalone",
        metavar="NAME",
        help="a standalone PR of patches/upstream-prs/ instead of a patch of the series (number, stem, name)",
    )
    clone = parser.add_mutually_exclusive_group(required=True)
    clone.add_argument("--repo", type=Path, help="the Airflow git clone")
    clone.add_argument(
        "--make-clone",
        type=Path,
        metavar="DIR",
        help="make a stand-in clone at DIR whose main is the 3.4 line's pinned files (tools.delivery."
        "pr_clone), then prepare the patch named, if any, in it",
    )
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
        repo = args.repo
        if args.make_clone is not None:
            print("\n".join(pr_clone.describe(pr_clone.make_clone(args.make_clone, layout=layout))))
            if args.patch is None and args.standalone is None:
                return 0
            repo = args.make_clone
        prep = PrPreparer(
            repo,
            layout=layout,
            base=args.base,
            python=args.python,
            generated_by=args.generated_by,
            out_dir=args.out_dir,
        )
        if (args.patch is None) == (args.standalone is None):
            raise PrError("name a patch of the series or --standalone NAME (one of them)")
        if args.standalone is not None:
            result = prep.prepare_standalone(
                args.standalone, branch=args.branch, force=args.force, run_tests=args.run_tests
            )
        else:
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

"""``nox -s package``: one wheel per pinned line, the series' executor as an Airflow provider.

Operators who build images (``pip install`` in a Dockerfile, site-packages read-only, a later
``pip install apache-airflow-core`` putting the unpatched file back) choose the executor by module
path instead of patching the built-in one in place::

    [core] executor = localexecutor_patched.executor.LocalExecutor

Each wheel is generated from the line's derived overlay (``airflow_overlay/<line>/``), never from a
hand-kept copy, and installs only files of its own under ``localexecutor_patched/``:

    localexecutor_patched/__init__.py     get_provider_info(): the executor (``airflow providers``);
                                          the series reads no [local_executor] option
    localexecutor_patched/_verified.py    the releases the wheel was verified on; any other
                                          apache-airflow-core or task-sdk is refused at import
    localexecutor_patched/executor.py     the overlay's local_executor.py byte for byte, plus two
                                          marked insertions: the refusal after ``from __future__``
                                          and, at the end, a wrapper of ``_run_worker`` that makes
                                          each worker supervise through the fixed subclass
    localexecutor_patched/_supervisor.py  ``ExitWaitingActivitySubprocess(ActivitySubprocess)``:
                                          the methods of task-sdk's ``WatchedSubprocess`` the
                                          series changes, copied verbatim from the overlay's
                                          supervisor.py (the build fails if the series changes
                                          anything else in that file)

The wheel is built with the standard library (``zipfile``): entries sorted, every timestamp the
newest patch's ``Date:`` (or ``SOURCE_DATE_EPOCH``), so the same checkout builds the same bytes.
"""

from __future__ import annotations

import argparse
import ast
import base64
import builtins
import email.utils
import hashlib
import io
import itertools
import json
import os
import re
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tools.delivery import pr_internals
from tools.engine import fetch, series
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT, Layout
from tools.shared.versions import version_key

DIST_NAME = "airflow-localexecutor-patched"  # no "apache-": this is not an ASF release
WHEEL_DIST = DIST_NAME.replace("-", "_")  # the distribution as wheel and .dist-info names spell it
IMPORT_NAME = "localexecutor_patched"
EXECUTOR_CLASS = f"{IMPORT_NAME}.executor.LocalExecutor"
ENTRY_POINT_GROUP = "apache_airflow_provider"
WHEEL_TAG = "py3-none-any"
GENERATOR = "lepatch tools/delivery/package.py"
SUPERVISOR_CLASS = "WatchedSubprocess"  # where the series' supervisor fix lives in task-sdk
SUBCLASS = "ExitWaitingActivitySubprocess"

INSERT_MARK = (
    "# -- added by airflow-localexecutor-patched (tools/delivery/package.py); not part of the series' file"
)
REFUSAL_INSERT = f"""
{INSERT_MARK}:
# refuse any apache-airflow-core or apache-airflow-task-sdk this wheel was not verified on, before
# anything of Airflow is imported (an older core lacks modules this file imports).
from {IMPORT_NAME}._verified import refuse_unverified

refuse_unverified()
# -- end of addition
"""
WORKER_EPILOGUE = f"""

{INSERT_MARK}:
# each worker supervises its task processes through {IMPORT_NAME}._supervisor.{SUBCLASS}, which
# carries the series' fix of task-sdk's supervisor.py without replacing that file. Only the worker
# processes are affected (installed after the fork or spawn, before the first workload).
_series_run_worker = _run_worker


def _run_worker(*args, **kwargs):
    from {IMPORT_NAME} import _supervisor

    _supervisor.install()
    return _series_run_worker(*args, **kwargs)
"""


class PackageError(ToolError):
    """The wheel cannot be built as derived; one line naming the file at fault."""


@dataclass(frozen=True)
class Verified:
    """What one line's wheel was verified on, and its file name."""

    line: str
    core: tuple[str, ...]
    task_sdk: tuple[str, ...]
    wheel: str


# The 2026-12-06 re-cut folded the 18 patches into 10; wheels of the 18-patch series were ``.post18``.
# The post-release number keeps rising across it, or pip would take the new wheels for older ones.
RECUT_OFFSET = 9


def series_length(layout: Layout = DEFAULT) -> int:
    """The post-release number: every added patch makes a new version and a new wheel name."""
    return len(series.read_series_names(layout.series_file)) + RECUT_OFFSET


def package_version(line: pins.Line, layout: Layout = DEFAULT) -> str:
    """PEP 440: the line's base, then the series length as a post-release (``3.3.2.post<N>``)."""
    return f"{line.version}.post{series_length(layout)}"


def wheel_name(line: pins.Line, layout: Layout = DEFAULT) -> str:
    """The wheel's file name: the one place it is made (the build, _verified.py, the docs' test)."""
    return f"{WHEEL_DIST}-{package_version(line, layout)}-{WHEEL_TAG}.whl"


def _versions(version: str, covers: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({version, *covers}, key=version_key))


def verified(line: pins.Line, layout: Layout = DEFAULT) -> Verified:
    sdk = _versions(line.sdk_version, line.sdk_covers) if line.sdk_version else ()
    return Verified(line.name, _versions(line.version, line.covers), sdk, wheel_name(line, layout))


def requirement(distribution: str, versions: Sequence[str]) -> str:
    """A Requires-Dist that admits exactly ``versions`` (consecutive patch releases of one line)."""
    if len(versions) == 1:
        return f"{distribution}=={versions[0]}"
    keys = [version_key(v) for v in versions]
    consecutive = all(not k.is_prerelease and not k.is_postrelease for k in keys) and all(
        b.release == (*a.release[:2], a.micro + 1) for a, b in itertools.pairwise(keys)
    )
    if not consecutive:
        raise PackageError(f"{distribution} {', '.join(versions)}: not consecutive patch releases")
    return f"{distribution}>={versions[0]},<={versions[-1]}"


# -- deriving the sources -----------------------------------------------------------------------


def _overlay(layout: Layout, line: pins.Line, file: pins.UpstreamFile) -> Path:
    path = layout.overlay / line.name / file.package_path
    if not path.is_file():
        raise PackageError(f"{layout.rel(path)}: no overlay; run `nox -s apply -- --write` first")
    return path


def executor_source(overlay_text: str) -> str:
    """The overlay's local_executor.py with the refusal and the worker wrapper inserted."""
    anchor = "from __future__ import annotations\n"
    if overlay_text.count(anchor) != 1 or "\ndef _run_worker(" not in overlay_text:
        raise PackageError("local_executor.py: expected one `from __future__` line and a _run_worker()")
    head, tail = overlay_text.split(anchor)
    return head + anchor + REFUSAL_INSERT + tail + WORKER_EPILOGUE


def strip_insertions(packaged: str) -> str:
    """Undo :func:`executor_source` (the tests prove the packaged file is the overlay plus these)."""
    if not packaged.endswith(WORKER_EPILOGUE) or REFUSAL_INSERT not in packaged:
        raise PackageError("executor.py: the package's insertions are not where they belong")
    return packaged[: -len(WORKER_EPILOGUE)].replace(REFUSAL_INSERT, "", 1)


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    if found := next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None):
        return found
    raise PackageError(f"supervisor.py has no class {name}")


def _methods(text: str, cls: str) -> dict[str, tuple[int, int]]:
    """Each method of ``cls``: its 0-based first line (decorators included) and end line."""
    out = {}
    for node in _class(ast.parse(text), cls).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            assert node.end_lineno is not None
            out[node.name] = (first, node.end_lineno)
    return out


def method_sources(text: str, cls: str = SUPERVISOR_CLASS) -> dict[str, str]:
    """The source of each method of ``cls`` in ``text``, verbatim (class indentation kept)."""
    lines = text.splitlines(keepends=True)
    return {name: "".join(lines[a:b]) for name, (a, b) in _methods(text, cls).items()}


def changed_methods(base: str, overlay: str) -> dict[str, str]:
    """The methods of WatchedSubprocess the series changes, as the overlay has them.

    Refuses when the series changes anything else in supervisor.py (another class, a module
    global, a new or removed method): a subclass could not carry that.
    """
    old, new = method_sources(base), method_sources(overlay)
    if set(old) != set(new):
        raise PackageError(
            f"supervisor.py: the series adds or removes {SUPERVISOR_CLASS} methods "
            f"({', '.join(sorted(set(old) ^ set(new)))}); a subclass cannot carry that"
        )
    changed = {name: src for name, src in new.items() if old[name] != src}
    # Put the overlay's changed methods into the base: it must then be the overlay, byte for byte.
    lines = base.splitlines(keepends=True)
    for name, (a, b) in sorted(_methods(base, SUPERVISOR_CLASS).items(), key=lambda kv: -kv[1][0]):
        if name in changed:
            lines[a:b] = [changed[name]]
    if "".join(lines) != overlay:
        raise PackageError(
            f"supervisor.py: the series changes more than methods of {SUPERVISOR_CLASS}; "
            "a subclass cannot carry that"
        )
    if not changed:
        raise PackageError(f"supervisor.py: the series changes no method of {SUPERVISOR_CLASS}")
    return changed


def _free_names(source: str) -> set[str]:
    """Module-level names a method's body reads (not its parameters, locals or builtins)."""
    tree = ast.parse("class _C:\n" + source)
    func = tree.body[0].body[0]  # type: ignore[attr-defined]
    if any(isinstance(n, ast.Name) and n.id == "super" for n in ast.walk(func)):
        raise PackageError(f"supervisor.py: {func.name} calls super(); a subclass copy would change it")
    bound = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
    loads: set[str] = set()
    for stmt in func.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name):
                (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    for d in func.decorator_list:
        loads |= {n.id for n in ast.walk(d) if isinstance(n, ast.Name)}
    return loads - bound - set(dir(builtins))


def supervisor_source(line: pins.Line, base: str, overlay: str, overlay_rel: str) -> str:
    """``_supervisor.py``: the subclass carrying the changed methods, verbatim, and install()."""
    changed = changed_methods(base, overlay)
    names = set().union(*(_free_names(src) for src in changed.values()))
    missing = names - set(pr_internals.module_names(ast.parse(overlay)))
    if missing:
        raise PackageError(f"supervisor.py: the changed methods read {sorted(missing)}, not module globals")
    imports = ", ".join(sorted(names | {"ActivitySubprocess"}))
    body = "\n".join(changed[name] for name in sorted(changed))
    return f'''"""The series' fix of task-sdk's supervisor, carried without replacing task-sdk's file.

Generated by tools/delivery/package.py for line {line.name} (apache-airflow-task-sdk {line.sdk_version}): the
methods of ``{SUPERVISOR_CLASS}`` that the series changes, copied verbatim from
{overlay_rel}; the build proves the series changes nothing else in that file.

Each worker of this package's LocalExecutor calls :func:`install` once, before its first workload:
task-sdk then supervises its task processes through :class:`{SUBCLASS}` (its task path looks
``ActivitySubprocess`` up in the supervisor module at each call). No other process is affected: not
the scheduler itself, nor the dag-processor, the triggerer or another executor's workers.
"""

from __future__ import annotations

from airflow.sdk.execution_time import supervisor as _supervisor
from airflow.sdk.execution_time.supervisor import {imports}

FIXED_METHODS = {tuple(sorted(changed))!r}


class {SUBCLASS}(ActivitySubprocess):
    """task-sdk's ActivitySubprocess with the series' supervisor fix ({", ".join(sorted(changed))})."""

    __slots__ = ()

{body}

def install() -> None:
    """In a worker process: supervise every task through {SUBCLASS}."""
    _supervisor.ActivitySubprocess = {SUBCLASS}
'''


def options_read(overlay_text: str) -> set[str]:
    """The [local_executor] options the executor reads (``conf.get("local_executor", "name")``)."""
    return set(re.findall(r'"local_executor",\s*"([a-z_]+)"', overlay_text))


def provider_info(line: pins.Line, overlay_text: str, layout: Layout = DEFAULT) -> dict[str, object]:
    # why: `airflow config list` shows a provider's options only as its provider info lists them; the
    # series reads none since the prefetch room went (issue 53), and a new one must be documented here.
    if read := options_read(overlay_text):
        raise PackageError(
            f"local_executor.py reads [local_executor] {sorted(read)}, which the wheel's provider info "
            "does not document (tools/delivery/package.py)"
        )
    info: dict[str, object] = {
        "package-name": DIST_NAME,
        "name": "LocalExecutor patch series",
        "description": (
            f"Apache Airflow's LocalExecutor with the LocalExecutor patch series, for apache-airflow-core "
            f"{line.name} (not an Apache Software Foundation release)"
        ),
        "versions": [package_version(line, layout)],
        "executors": [EXECUTOR_CLASS],
    }
    if "cli" in provider_schema(line, layout)["properties"]:
        # The executor adds no CLI command; saying so keeps Airflow's CLI (3.2+) from importing the
        # executor for its get_cli_commands() on every command, and from warning about it.
        info["cli"] = [f"{IMPORT_NAME}.get_cli_commands"]
    return info


def provider_schema(line: pins.Line, layout: Layout = DEFAULT) -> dict[str, Any]:
    """The runtime schema the line's core validates get_provider_info() against."""
    with zipfile.ZipFile(fetch.ensure_wheel(line, layout)) as zf:
        schema: dict[str, Any] = json.loads(zf.read("airflow/provider_info.schema.json"))
    return schema


VERIFIED_TEMPLATE = '''"""What this wheel was verified on; anything else is refused at import of the executor.

Generated by tools/delivery/package.py from tools/shared/pins.py. The executor runs only on an
apache-airflow-core and apache-airflow-task-sdk release its overlay was verified against: on any
other, importing {import_name}.executor raises AirflowConfigException (one line) naming both
versions and the wheel to install instead, so the scheduler stops at start.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = {dist!r}
VERSION = {version!r}
LINE = {line!r}
CORE = {core!r}
TASK_SDK = {sdk!r}
# The pair pip installs together (core pins its task-sdk exactly), and the task-sdk releases the
# line's overlay carries a supervisor fix of its own for (the wheel's subclass is its base's).
BASE = {base!r}
OVERLAY_TASK_SDK = {overlay_sdk!r}
# Every line's wheel of the same series: (line, apache-airflow-core releases, task-sdk releases, wheel).
WHEELS = {wheels}


def installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def problem(core: str | None, task_sdk: str | None) -> str | None:
    """None if this wheel was verified on these versions, else the one-line refusal."""
    if core in CORE and task_sdk in TASK_SDK:
        return None
    what = (
        f"{{DISTRIBUTION}} {{VERSION}} was verified on apache-airflow-core {{'/'.join(CORE)}} with "
        f"apache-airflow-task-sdk {{'/'.join(TASK_SDK)}}, not on apache-airflow-core {{core or 'missing'}} "
        f"with apache-airflow-task-sdk {{task_sdk or 'missing'}}"
    )
    if core in CORE:
        fix = (
            f"{{what}}: `pip install 'apache-airflow-core=={{BASE[0]}}' "
            f"'apache-airflow-task-sdk=={{BASE[1]}}'`, the pair this wheel was verified on"
        )
        if task_sdk in OVERLAY_TASK_SDK:
            fix += (
                f"; or keep them and install the patched Airflow wheels instead (`nox -s overlay -- "
                f"--release {{core}}`), verified with apache-airflow-task-sdk {{task_sdk}}"
            )
        return fix
    for _line, cores, sdks, wheel in WHEELS:
        if core in cores:
            extra = "" if task_sdk in sdks else f" (verified with apache-airflow-task-sdk {{'/'.join(sdks)}})"
            return f"{{what}}: install {{wheel}} instead{{extra}}"
    return (
        f"{{what}}: no wheel of this series was verified on apache-airflow-core {{core or 'missing'}}; "
        "set [core] executor = LocalExecutor for the built-in one"
    )


def refuse_unverified() -> None:
    message = problem(installed("apache-airflow-core"), installed("apache-airflow-task-sdk"))
    if message is not None:
        from airflow.exceptions import AirflowConfigException

        raise AirflowConfigException(message)
'''


INIT_TEMPLATE = '''"""Airflow's LocalExecutor with the patch series, for apache-airflow-core {line}.

Not an Apache Software Foundation release. Choose it with::

    [core] executor = {executor}

Generated by tools/delivery/package.py from airflow_overlay/{line}/ of the series; importing this package
imports nothing of Airflow (the providers manager calls get_provider_info() on any version).
"""

from __future__ import annotations

import json
from typing import Any

__version__ = {version!r}

_PROVIDER_INFO = """
{info}
"""


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers`` shows: the executor."""
    info: dict[str, Any] = json.loads(_PROVIDER_INFO)
    return info


def get_cli_commands() -> list[Any]:
    """The executor adds no ``airflow`` command."""
    return []
'''


def sources(line: pins.Line, layout: Layout = DEFAULT) -> dict[str, bytes]:
    """Every file of the package, by its path in the wheel (without .dist-info)."""
    if not line.sdk_version:
        raise PackageError(f"line {line.name}: no apache-airflow-task-sdk pinned in tools/shared/pins.py")
    ex_path = _overlay(layout, line, pins.EXECUTOR)
    sup_path = _overlay(layout, line, pins.SUPERVISOR)
    ex_text = ex_path.read_text(encoding="utf-8")
    sup_text = sup_path.read_text(encoding="utf-8")
    base_sup = fetch.read_bases(line, layout)[pins.SUPERVISOR.repo_path].decode("utf-8")
    version = package_version(line, layout)
    wheels = tuple(
        (v.line, v.core, v.task_sdk, v.wheel)
        for v in (verified(ln, layout) for ln in pins.LINES)
        if v.task_sdk
    )
    me = verified(line, layout)
    info = json.dumps(provider_info(line, ex_text, layout), indent=4, sort_keys=True)
    if "\\" in info or '"""' in info:
        raise PackageError("provider info: a description holds a backslash or triple quote")
    init = INIT_TEMPLATE.format(line=line.name, executor=EXECUTOR_CLASS, version=version, info=info)
    ver = VERIFIED_TEMPLATE.format(
        import_name=IMPORT_NAME,
        dist=DIST_NAME,
        version=version,
        line=line.name,
        core=me.core,
        sdk=me.task_sdk,
        base=(line.version, line.sdk_version),
        overlay_sdk=tuple(line.sdk_versions),
        wheels="(\n" + "".join(f"    {w!r},\n" for w in wheels) + ")",
    )
    return {
        f"{IMPORT_NAME}/__init__.py": init.encode(),
        f"{IMPORT_NAME}/_verified.py": ver.encode(),
        f"{IMPORT_NAME}/executor.py": executor_source(ex_text).encode(),
        f"{IMPORT_NAME}/_supervisor.py": supervisor_source(
            line, base_sup, sup_text, layout.rel(sup_path)
        ).encode(),
    }


# -- the wheel ----------------------------------------------------------------------------------


def metadata(line: pins.Line, layout: Layout = DEFAULT) -> str:
    me = verified(line, layout)
    n = series_length(layout)
    desc = f"""Apache Airflow's LocalExecutor with the LocalExecutor patch series ({n} patches), for
apache-airflow-core {"/".join(me.core)} with apache-airflow-task-sdk {"/".join(me.task_sdk)}: the dispatch
deadlock (apache/airflow#70526) and a killed worker wedging the others (#74575) fixed, and
task-sdk's supervisor seeing its task exit at once. Not an Apache Software Foundation release.

    pip install {me.wheel}
    AIRFLOW__CORE__EXECUTOR={EXECUTOR_CLASS}

On any other apache-airflow-core or task-sdk release the executor refuses to load, naming the
wheel to install instead. The built-in LocalExecutor is left as it is.
"""
    headers = [
        ("Metadata-Version", "2.1"),
        ("Name", DIST_NAME),
        ("Version", package_version(line, layout)),
        ("Summary", f"Airflow's LocalExecutor with the patch series, for apache-airflow-core {line.name}"),
        ("License", "Apache-2.0"),
        ("Classifier", "Framework :: Apache Airflow"),
        ("Classifier", "Framework :: Apache Airflow :: Provider"),
        ("Classifier", "License :: OSI Approved :: Apache Software License"),
        ("Requires-Python", fetch.requires_python(fetch.ensure_wheel(line, layout))),
        ("Requires-Dist", requirement("apache-airflow-core", me.core)),
        ("Requires-Dist", requirement("apache-airflow-task-sdk", me.task_sdk)),
        ("Description-Content-Type", "text/plain"),
    ]
    return "".join(f"{k}: {v}\n" for k, v in headers) + "\n" + desc


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def source_date(layout: Layout = DEFAULT) -> datetime:
    """Every entry's timestamp: SOURCE_DATE_EPOCH, else the newest patch's Date:."""
    if env := os.environ.get("SOURCE_DATE_EPOCH"):
        return datetime.fromtimestamp(int(env), tz=timezone.utc)
    dates = [
        email.utils.parsedate_to_datetime(p.date) for p in series.load_series(layout).ordered() if p.date
    ]
    if not dates:
        return datetime(2026, 1, 1, tzinfo=timezone.utc)
    return max(dates).astimezone(timezone.utc)


def wheel_bytes(line: pins.Line, layout: Layout = DEFAULT) -> bytes:
    """The wheel of ``line``: the same checkout gives the same bytes."""
    dist_info = f"{WHEEL_DIST}-{package_version(line, layout)}.dist-info"
    files = dict(sorted(sources(line, layout).items()))
    files[f"{dist_info}/METADATA"] = metadata(line, layout).encode()
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {WHEEL_TAG}\n"
    ).encode()
    files[f"{dist_info}/entry_points.txt"] = (
        f"[{ENTRY_POINT_GROUP}]\nprovider_info = {IMPORT_NAME}:get_provider_info\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = f"{IMPORT_NAME}\n".encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    stamp = source_date(layout)
    date_time = (max(stamp.year, 1980), stamp.month, stamp.day, stamp.hour, stamp.minute, stamp.second)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # Unix, whatever builds it
            zf.writestr(info, data)
    return buf.getvalue()


def build(line: pins.Line, out: Path, layout: Layout = DEFAULT) -> Path:
    """Write ``line``'s wheel into ``out`` (replacing it atomically); returns its path."""
    data = wheel_bytes(line, layout)
    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel_name(line, layout)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def _cmd_package(args: argparse.Namespace) -> int:
    lines = pins.selected_lines(args)
    out = args.out.resolve()
    for line in lines:
        path = build(line, out)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{line.label}: {DEFAULT.rel(path)} sha256 {digest[:16]}")
    print(f"install one with `pip install dist/<wheel>`, then set AIRFLOW__CORE__EXECUTOR={EXECUTOR_CLASS}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "package",
        help="build one wheel per pinned line into dist/: the series' executor as an Airflow provider",
    )
    pins.add_line_options(p)
    p.add_argument("--out", type=Path, default=DEFAULT.root / "dist", help="default: dist/")
    p.set_defaults(func=_cmd_package)

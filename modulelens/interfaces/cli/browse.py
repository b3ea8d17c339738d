"""What ``ls`` and ``show`` do, with no typer in sight: the typer commands of ``core.py`` and the
direct path of ``_direct.py`` (which runs a plain ``ls`` or ``show`` without importing typer, the
larger part of their start: docs/performance.md, "CLI start") both call these.

Both print plain text and start without rich (other renderers build their tables with
``output.rich_table``, which imports it on first use).
"""

from __future__ import annotations

from modulelens.errors import UsageError
from modulelens.format.human import human_bytes
from modulelens.interfaces import session
from modulelens.interfaces.output import echo, emit, emit_json, text_table

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    from typing import Any

# What `show` prints without --all (docs/cli.md): the UI's capture page shows 20 calls and 16 leaves
# of each (docs/ui.md, "Limits"); a terminal gets a little more of the calls.
SHOWN_CALLS = 50
SHOWN_LEAVES = 16
SHOWN_REPORTS = 10


def list_captures(name: str | None = None, class_: str | None = None, tag: list[str] | None = None,
                  since: str | None = None, sort: str = "name", repo: str | None = None,
                  as_json: bool = False) -> None:
    """``modulelens ls``: list captures (name, version, aliases, module class, calls, tags, size, created).

    Args:
        name: only this name, or names starting with this prefix/.
        class_: only captures of this module class (a name, a glob or ``pkg.module:Class``).
        tag: only versions carrying all these tags.
        since: only versions created since a duration back from now (``12h``) or a date.
        sort: ``name``, ``created``, ``size`` or ``calls``.
        repo: the repo directory or URL (default: ``$MODULELENS_REPO``).
        as_json: print one JSON object (docs/cli-json.md) instead of a table.

    Example::

        list_captures("team/", sort="created")
    """
    from modulelens.interfaces.listing import SORT_KEYS, VersionFilter, sort_versions

    selection = VersionFilter.from_options(module_class=class_, tags=tag or [], since=since)
    if sort not in SORT_KEYS:
        raise UsageError(f"--sort: {sort!r} is not one of {', '.join(SORT_KEYS)}")
    store = session.open_repo(repo, create=repo is None)  # a mistyped --repo is an error, not a new repo
    versions = sort_versions([v for v in session.list_versions(store, name) if selection.keeps(v)], sort)
    rows = [info.to_dict() for info in versions]

    def render(result: list[dict[str, Any]]) -> None:
        if not result:
            echo(f"no captures in {store.location}" + (" match " + selection.describe() if selection.active else ""))
            return
        # Plain aligned text, not a rich table: rendering 2,000 rows through rich took longer than
        # the rest of `ls`. A ref is what people copy into the next command, so it is never cut;
        # on a narrow terminal the last columns go instead (text_table).
        cells = [[row["ref"], ", ".join(row["aliases"]),
                  "damaged (see show)" if row.get("problem") else row["module_class"].rsplit(":", 1)[-1],
                  str(row["calls"]), ", ".join(row["tags"]), human_bytes(row["payload_bytes"]), row["created"]]
                 for row in result]
        echo(f"captures in {store.location}" + (" matching " + selection.describe() if selection.active else ""))
        lines = text_table(["ref", "aliases", "module class", "calls", "tags", "payload", "created"], cells)
        echo(lines[0], bold=True)
        echo("\n".join(lines[1:]))

    emit("ls", as_json, rows, render)


def show_capture(ref: str, repo: str | None = None, ops: bool = False, show_all: bool = False,
                 as_json: bool = False) -> None:
    """``modulelens show``: one capture's class, constructor arguments, state, calls, environment and
    reports, bounded unless ``show_all`` (``--json`` has it all).

    Args:
        ref: ``NAME[:vN|:alias]`` or a ``wandb://`` reference.
        repo: the repo directory or URL (default: ``$MODULELENS_REPO``).
        ops: list each printed call's op trace.
        show_all: print every call, leaf and report.
        as_json: print one JSON object (docs/cli-json.md).

    Example::

        show_capture("team/mlp:v2", ops=True)
    """
    from modulelens.restore.summary import describe, op_rows, op_trace_document

    store, ref = session.open_ref(ref, repo)
    name, version = session.resolve(store, ref)
    meta = store.read_metadata(name, version)
    result = describe(store, f"{name}:v{version}", metadata=meta)
    if ops:  # read only when asked (a trace of thousands of ops is a blob of its own), for the calls printed
        listed = result["calls"] if as_json or show_all else result["calls"][:SHOWN_CALLS]
        for position, call in enumerate(listed):
            document = op_trace_document(store, f"{name}:v{version}", position)
            call["ops"] = op_rows(document) if document is not None else None
    if as_json:
        emit_json("show", result=result)
        return
    print_show(result, meta, bounded=not show_all)
    from modulelens.interfaces.ui.discovery import capture_url  # a running `modulelens ui` of this repo

    if url := capture_url(store.location, result["ref"]):
        echo(f"in the browser: {url}")


def print_show(result: dict[str, Any], meta: dict[str, Any], *, bounded: bool = True) -> None:
    """Print ``show``'s text for people: ``result`` is ``describe``'s, ``meta`` the checked metadata
    it describes (its constructor arguments that are modules or tensors are written out from its
    constructions and tensors tables). Also what ``show``'s quick path prints (_quick_show.py).

    Example::

        print_show(describe_metadata(meta, info.to_dict(), reports), meta)
    """
    emit("show", False, result, lambda d: _render_show(d, result, meta.get("constructions", {}), meta.get("tensors", {}),
                                                       bounded=bounded))


def _render_show(d: dict[str, Any], raw: dict[str, Any], constructions: dict[str, Any], tensors: dict[str, Any],
                 bounded: bool = True) -> None:
    """``show`` for people: plain text, like ls (show starts without rich). ``d`` is the result with
    its text made safe for the terminal; recorded values are rendered from ``raw`` (Python-like
    text quotes strings with ``repr``, which writes out every control character itself).
    ``bounded``: at most ``SHOWN_CALLS`` calls, ``SHOWN_LEAVES`` leaves a cell and ``SHOWN_REPORTS``
    reports, each cut counted (a call returning a million leaves printed 7.9 MB, issue 35)."""
    from modulelens.interfaces.value_text import call_text, python_like

    def value(v: object, limit: int | None = None) -> str:
        return python_like(v, constructions=constructions, tensors=tensors, limit=limit)

    echo(f"{d['ref']}", bold=True)
    echo(f"aliases: {', '.join(d['aliases']) or '-'}   tags: {', '.join(d['tags']) or '-'}   created: {d['created']}")
    echo(f"stored at: {d['path']}")
    how = f", calls of .{d['method']}()" if d.get("method") else ""
    echo(f"class: {d['module_class']}   (captured as '{d['qualified_name'] or '<root>'}'{how})")
    construction = raw["construction"]
    if construction:
        one_line = call_text(construction["class"], construction["args"], construction["kwargs"],
                             constructions=constructions, tensors=tensors)
        if len(one_line) <= 100:
            echo(f"constructor: {one_line}")
        else:  # one argument a line, each cut to a readable length (show --json has them whole)
            echo(f"constructor: {construction['class'].rpartition(':')[2]}(")
            for arg in construction["args"]:
                echo(f"    {value(arg, 400)},")
            for key, arg in construction["kwargs"].items():
                echo(f"    {key}={value(arg, 400)},")
            echo(")")
    else:
        # styled whole (echo styles on a terminal only; a style code inside the text would be escaped)
        echo(f"constructor: not recorded ({d['construction_missing']})", fg="yellow")
    if d.get("hooks_not_rebuilt"):  # issue 22: the loaded module runs without them
        echo("hooks not rebuilt: " + "; ".join(d["hooks_not_rebuilt"]), fg="yellow")
    echo(f"parameters: {d['parameter_count']:,} in {len(d['parameters'])} tensors; "
         f"buffers: {len(d['buffers'])}; states: {d['states']}; payload {human_bytes(d['payload_bytes'])}")
    echo("recorded calls", bold=True)
    shown = raw["calls"][:SHOWN_CALLS] if bounded else raw["calls"]
    leaves = SHOWN_LEAVES if bounded else None
    calls = [[str(c["index"]), ("train" if c["training"] else "eval") + ("" if c["grad_enabled"] else ", no_grad"),
              _leaves_text(c["inputs"], value, leaves), _leaves_text(c["outputs"], value, leaves)] for c in shown]
    echo("\n".join("  " + line for line in text_table(["call", "mode", "inputs", "outputs"], calls, fit=False)))
    if len(shown) < len(raw["calls"]):
        echo(f"  ... and {len(raw['calls']) - len(shown):,} more recorded calls, not shown (show --all or --json lists "
             "them)")
    _render_op_traces(d["calls"][:len(shown)])
    env = d["environment"]
    echo(f"environment: torch {env.get('torch')} python {env.get('python')} on {env.get('host')}"
         f" rank {env.get('rank')}/{env.get('world_size')} git {env.get('git_commit') or '-'} at {env.get('time')}")
    if raw["metadata"]:
        echo("metadata: " + ", ".join(f"{k}={value(v, 80)}" for k, v in raw["metadata"].items()))
    in_time = sorted(d["reports"], key=lambda r: str(r.get("created") or ""))  # stored by kind, then time
    reports = in_time[-SHOWN_REPORTS:] if bounded else in_time
    if len(reports) < len(d["reports"]):
        echo(f"... {len(d['reports']) - len(reports):,} older reports, not shown (show --all or --json lists them)")
    for r in reports:
        echo(f"report: {r['kind']} {r['created']} passed={r['passed']}")


def _render_op_traces(calls: list[dict[str, Any]]) -> None:
    """The op trace of each call that has one: its counts, and with ``--ops`` one line per op."""
    for call in calls:
        trace = call.get("op_trace")
        if not trace:
            continue
        kept = f", {trace['values']} outputs' values kept" + (
            f" ({trace['values_dropped']} over the budget: fingerprint and statistics only)"
            if trace.get("values_dropped") else "")
        truncated = f", {trace['truncated']} more not recorded" if trace.get("truncated") else ""
        echo(f"op trace of call {call['index']}: {trace['ops']} ops in {trace['modules']} module calls{kept}{truncated}"
             + ("" if call.get("ops") is not None else " (show --ops lists them)"))
        if call.get("ops") is None:
            continue
        rows = [[str(op["index"]), op["module"] or "<root>", op["op"],
                 ", ".join(_op_output_text(out) for out in op["outputs"]),
                 (op["source"] or "").replace("\\", "/").rsplit("/", 1)[-1]] for op in call["ops"]]
        echo("\n".join("  " + line for line in text_table(["#", "module", "op", "outputs", "source"], rows, fit=False)))


def _op_output_text(out: dict[str, Any]) -> str:
    """``float32[2, 8] xxh3 1a2b3c4d mean 0.12`` (or a scalar)."""
    if "scalar" in out:
        return repr(out["scalar"])
    text = f"{out['dtype']}[{', '.join(str(s) for s in out['shape'])}]"
    if out.get("fingerprint"):
        text += f" {out['fingerprint'].partition(':')[2][:8]}"
    mean = (out.get("stats") or {}).get("mean")
    return text + (f" mean {mean:.4g}" if isinstance(mean, (int, float)) else "")


def _leaves_text(leaves: list[dict[str, Any]], value: Any, limit: int | None = None) -> str:
    """A call's inputs or outputs in one cell: ``float32[3, 8], 4, <unrecorded mylib.Cache>``; past
    ``limit`` leaves, a count of the rest (``... and 999,984 more leaves``)."""
    parts = []
    for leaf in leaves[:limit]:
        if leaf["kind"] in ("tensor", "shape-only"):
            shape = ", ".join(str(s) for s in leaf["shape"])
            parts.append(f"{leaf['dtype']}[{shape}]" + (" (shape only)" if leaf["kind"] == "shape-only" else ""))
        elif leaf["kind"] == "unrecorded":
            parts.append(f"<unrecorded {leaf['type']}>")
        else:
            parts.append(value(leaf["value"], 40))
    if limit is not None and len(leaves) > limit:
        parts.append(f"... and {len(leaves) - limit:,} more leaves")
    return ", ".join(parts)

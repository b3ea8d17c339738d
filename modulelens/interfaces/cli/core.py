"""Core commands: browse (``ls``, ``show``), ``replay``, manage (``alias``, ``rm``, ``gc``), ``run``, ``demo``.

``ls`` and ``show`` are declared here and done in ``browse.py`` (which ``_direct.py`` also runs,
without typer). Renderers build their tables with ``output.rich_table``, which imports rich on
first use.
"""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer

from modulelens.errors import CorruptCaptureError, NothingCapturedError, RemoteRepoError, UsageError
from modulelens.format.human import human_bytes
from modulelens.interfaces import session
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import (
    AtolOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    RepoOpt,
    RtolOpt,
    TrustOpt,
    UlpsOpt,
    YesOpt,
)
from modulelens.interfaces.cli.browse import SHOWN_CALLS, SHOWN_LEAVES, SHOWN_REPORTS, list_captures, show_capture
from modulelens.interfaces.listing import parse_duration
from modulelens.interfaces.output import console, echo, emit, emit_json, err_console, rich_table, safe_tree, steps, text_table

app = typer.Typer()

# ------------------------------------------------------------------------------------- browse


@command(app, "ls")
def ls(
    name: Annotated[str | None, typer.Argument(help="Only this name (or names starting with this prefix/).")] = None,
    class_: Annotated[str | None, typer.Option(
        "--class", metavar="CLASS", help="Only captures of this module class: a name (LlamaMLP), a glob (Llama*) "
                                         "or a full path (pkg.module:Class).")] = None,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", help="Only versions carrying this tag; repeat for several (all must be there).")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="WHEN", help="Only versions created since: a duration back from now (90m, 12h, 2d) "
                                        "or a date (2026-11-30, 2026-11-30T10:00).")] = None,
    sort: Annotated[str, typer.Option(
        "--sort", metavar="KEY", help="name (then version), created (newest first), size or calls (largest first).")] = "name",
    repo: RepoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List captures: name, version, aliases, module class, calls, tags, size, created."""
    list_captures(name, class_, tag, since, sort, repo, as_json)


@command(app, "show")
def show(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias], or wandb://ENTITY/PROJECT/COLLECTION:alias")],
    repo: RepoOpt = None,
    ops: Annotated[bool, typer.Option(
        "--ops", help="List each recorded call's op trace: every aten op, its module, source line and outputs.")] = False,
    show_all: Annotated[bool, typer.Option(
        "--all", help=f"Print every recorded call, input and output leaf and report (default: the first "
                      f"{SHOWN_CALLS} calls, {SHOWN_LEAVES} leaves of each call's inputs and outputs, the newest "
                      f"{SHOWN_REPORTS} reports, and a count of the rest; --json always has them all).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show one capture: class, constructor arguments, state, calls, environment, reports (bounded: a count says what
    is not printed; --all prints it, --json has it all)."""
    show_capture(ref, repo, ops, show_all, as_json)


# ------------------------------------------------------------------------------------- replay


@command(app, "replay")
def replay_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    repo: RepoOpt = None,
    trust_source: TrustOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    ulps: UlpsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild the module, run every recorded call, compare with the recorded outputs (exit 1 on a mismatch, and
    when nothing recorded could be compared: UNVERIFIED, "cannot verify: ...")."""
    with steps(not as_json) as step:
        step(f"loading {ref}: importing torch and the module's code, rebuilding it")
        capture = session.load_capture(ref, repo, device=device, dtype=dtype, trust_source=trust_source)
        step(f"replaying the {len(capture.calls)} recorded call(s) of {capture.ref}")
        from modulelens.restore.compare import parse_ulps

        report = capture.replay(rtol=rtol, atol=atol, ulps=None if ulps is None else parse_ulps(ulps))
    styles = {"PASS": "green", "pass": "green", "FAIL": "red", "fail": "red", "UNVERIFIED": "yellow", "unverified": "yellow"}

    def render(r: dict[str, Any]) -> None:
        from rich.markup import escape

        style = styles[r["status"]]
        console.print(f"[{style}]{r['status']}[/{style}] replay of {escape(r['ref'])} on {r['device']} ({r['mode']})")
        for reason in r["unverified"]:  # nothing failed, and nothing real was compared: never a pass
            console.print(f"cannot verify: {escape(reason)}", highlight=False, soft_wrap=True)
        table = rich_table()
        for col in ("call", "result", "max abs err", "max rel err", "max ULPs", "time", "detail"):
            table.add_column(col)
        for c in r["calls"]:
            leaves = [*c["leaves"], *c["grad_leaves"]]
            abs_err = max((float(leaf["max_abs_error"]) for leaf in leaves), default=0.0)  # "nan" in a dict
            rel_err = max((float(leaf["max_rel_error"]) for leaf in leaves), default=0.0)
            ulps_err = max((float(leaf["max_ulps"]) for leaf in leaves if leaf.get("max_ulps") is not None), default=None)
            worst = next((leaf for leaf in leaves if not leaf["passed"]), None)
            not_compared = [leaf for leaf in leaves if not leaf["compared"]]
            if c["error"]:
                detail = c["error"]
            elif worst is not None:
                detail = f"{worst['path']}: {worst['message']}"
            elif not_compared:
                detail = (f"not compared: {', '.join(leaf['path'] for leaf in not_compared)} "
                          f"({not_compared[0]['message']})")
            elif c.get("unverified"):  # every leaf matched, and proves nothing (None, empty, NaN)
                detail = "; ".join(c["unverified"])
            else:
                detail = f"{len(leaves)} leaves match"
            table.add_row(str(c["index"]), f"[{styles[c['status']]}]{c['status']}[/{styles[c['status']]}]",
                          f"{abs_err:.3g}", f"{rel_err:.3g}", "-" if ulps_err is None else f"{ulps_err:.3g}",
                          f"{c['seconds'] * 1e3:.2f} ms", escape(detail))
        console.print(table)
        for c in r["calls"]:
            if c.get("divergence"):  # docs/tools.md, "First divergence"
                console.print(f"call {c['index']}: {escape(c['divergence']['summary'])}", highlight=False,
                              soft_wrap=True)
        for note in r["notes"]:
            console.print(f"note: {escape(note)}", highlight=False)

    emit("replay", as_json, report.to_dict(), render)
    if not report.passed:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------- manage


@command(app, "alias")
def alias_cmd(
    ref: Annotated[str, typer.Argument(help="NAME:vN (or NAME:alias) to point at; with --delete, NAME")],
    alias: Annotated[str, typer.Argument(help="Alias name, e.g. golden")],
    delete: Annotated[bool, typer.Option("--delete", help="Remove the alias instead.")] = False,
    repo: RepoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Point an alias (movable) at a version, or remove it."""
    store = session.open_repo(repo)
    if delete:
        name = ref.partition(":")[0]
        store.remove_alias(name, alias)
        result: dict[str, Any] = {"name": name, "alias": alias, "deleted": True}
    else:
        result = {"alias": alias, **store.set_alias(ref, alias).to_dict()}
    emit("alias", as_json, result, lambda r: console.print(
        f"removed alias {alias} of {r['name']}" if delete else f"{r['name']}:{alias} -> {r['ref']}"))


@command(app, "rm")
def rm_cmd(
    ref: Annotated[str, typer.Argument(help="NAME:vN or NAME:alias (one version) or NAME (all versions)")],
    repo: RepoOpt = None,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove a version (or every version of a name). Payloads are freed by `gc`. Asks before removing an aliased version."""
    store = session.open_repo(repo)
    aliased = session.aliased_versions(store, ref)
    if aliased and not yes:
        what = "; ".join(f"{v} is {', '.join(a)}" for v, a in aliased.items())
        if as_json or not session.interactive():
            raise UsageError(f"not removed: {what}; pass --yes to remove it anyway")
        if not typer.confirm(f"{what}. Remove?", default=False, err=True):
            raise UsageError("not removed")
    removed = store.remove(ref)
    emit("rm", as_json, {"removed": removed}, lambda r: console.print("removed " + ", ".join(r["removed"])))


@command(app, "trust")
def trust_cmd(
    repo: RepoOpt = None,
    revoke: Annotated[bool, typer.Option("--revoke", help="Stop trusting this repo's stored source.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Trust the source stored in YOUR OWN repo: loading its captures may then run that source.

    Bound to this directory and user: a repo copied or downloaded from elsewhere never arrives
    trusted. Never trust a repo holding captures from people you do not trust (docs/security.md)."""
    store = session.open_repo(repo)
    store.trust_source = not revoke
    result = {"repo": store.location, "trust_source": store.trust_source}
    emit("trust", as_json, result,
         lambda r: console.print(f"{r['repo']}: stored source {'trusted' if r['trust_source'] else 'not trusted'}"))


@command(app, "gc")
def gc_cmd(
    repo: RepoOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only report what would be removed.")] = False,
    tmp_older_than: Annotated[str, typer.Option(
        "--tmp-older-than", metavar="DURATION",
        help="Free staging left by writers that are gone once it is this old: 0, 90s, 10m, 1h, 2d. "
             "A running writer's staging is never freed.")] = "1h",
    as_json: JsonOpt = False,
) -> None:
    """Delete payloads that no version references, and staging left by crashed writers."""
    report = session.open_repo(repo).gc(dry_run=dry_run, tmp_age_s=parse_duration(tmp_older_than, "--tmp-older-than"))
    emit("gc", as_json, report.to_dict(), lambda r: console.print(
        f"{'would remove' if dry_run else 'removed'} {r['removed_blobs']} payloads "
        f"({human_bytes(r['freed_bytes'])}), kept {r['kept_blobs']}; {r['removed_tmp']} staging entries"))


@command(app, "fsck")
def fsck_cmd(
    repo: RepoOpt = None,
    repair: Annotated[bool, typer.Option(
        "--repair", help="Move what is broken into the repo's quarantine/ folder (never deletes) and rebuild summaries.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check every version's metadata and payloads (full hashes), aliases, summaries and the repo's
    layout; exit 3 when something is broken (and not repaired). Remote repos: a read-only check of
    metadata, payload sizes and aliases."""
    with steps(not as_json) as step:
        step("checking every version's metadata and payload hashes" + (", repairing" if repair else ""))
        report = session.open_repo(repo).fsck(repair=repair)

    def render(r: dict[str, Any]) -> None:
        from rich.markup import escape

        for p in r["problems"]:
            mark = "[green]repaired[/green]" if p["repaired"] else "[red]problem[/red]"
            console.print(f"{mark} {p['kind']}: {escape(p['path'])}: {escape(p['detail'])}", soft_wrap=True)
        for action in r["actions"]:
            console.print(escape(action), soft_wrap=True, highlight=False)
        state = "clean" if r["clean"] else f"{sum(not p['repaired'] for p in r['problems'])} problems"
        console.print(f"{r['repo']}: {state}; {r['versions']} versions of {r['names']} names, {r['payloads_checked']} "
                      f"payloads ({human_bytes(r['bytes_checked'])}) hashed; {r['orphan_blobs']} unreferenced payloads "
                      f"({human_bytes(r['orphan_bytes'])}) and {r['stale_staging']} stale staging entries for gc",
                      soft_wrap=True, highlight=False)

    emit("fsck", as_json, report.to_dict(), render)
    if not report.clean:
        raise typer.Exit(CorruptCaptureError.exit_code)


# ------------------------------------------------------------------------------------- capture


@command(app, "run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    ctx: typer.Context,
    target: Annotated[list[str] | None, typer.Option(
        "--target", "-t", help="Qualified-name glob or class name; repeatable. '*' crosses dots: 'layer1.*' is "
                               "every module under layer1 (see --depth). NAME:METHOD records calls of that method "
                               "instead of module(...): -t 'vae:encode', -t ':sample' (the root's), "
                               "-t 'GP:__call__'.")] = None,
    depth: Annotated[int | None, typer.Option(
        "--depth", min=1, help="Keep glob matches at most this many levels below the pattern's fixed prefix: "
                               "-t 'layer1.*' --depth 1 is layer1.0, layer1.1, not layer1.0.conv1.")] = None,
    list_modules: Annotated[bool, typer.Option(
        "--list-modules", help="Print the qualified names and classes of the first model called, then stop.")] = False,
    warmup: Annotated[int, typer.Option(help="Calls to skip per target before recording.")] = 0,
    max_calls: Annotated[int, typer.Option(help="Calls to record per target.")] = 1,
    backward: Annotated[bool, typer.Option("--backward", help="Also record gradients (output, input, parameter).")] = False,
    shape_only_over: Annotated[int | None, typer.Option(
        "--shape-only-over", help="Store call tensors bigger than this many bytes shape-only (dtype, shape, stats).")] = None,
    max_bytes: Annotated[int | None, typer.Option(
        "--max-bytes", help="Payload budget per capture in bytes; the biggest call tensors go shape-only.")] = None,
    op_trace: Annotated[bool, typer.Option(
        "--op-trace", help="Also record each recorded call's aten ops (module, source line, fingerprint and "
                           "statistics of each output): replay and verify then name the first op that differs.")] = False,
    op_trace_values: Annotated[int, typer.Option(
        "--op-trace-values", min=0, help="Bytes of op output values kept per recorded call with --op-trace.")] = 16 << 20,
    settle_at_return: Annotated[bool, typer.Option(
        "--settle-at-return", help="Finish reading a recorded call's large weights before it returns, for jobs that "
                                   "change weights through .data with no optimizer step or backward between "
                                   "(docs/fidelity.md).")] = False,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag the saved versions; repeatable.")] = None,
    exit_after_capture: Annotated[bool, typer.Option(help="End the job once everything is captured and saved.")] = False,
    repo: RepoOpt = None,
    name: Annotated[str | None, typer.Option(help="Name prefix (default: the root model's class name).")] = None,
    ranks: Annotated[str, typer.Option(help="Ranks that record in distributed jobs: '0', '0,1' or 'all'.")] = "0",
    strict: Annotated[bool, typer.Option(
        help="Raise on capture problems instead of warning; stop the job (exit 2) at a target that matches "
             "no module of the first model called.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a command (after `--`) with capture on, no code change: modulelens run -t mlp -- python train.py."""
    from modulelens.tracing.runner import RunConfig, run_command

    command_line = list(ctx.args)
    if command_line and command_line[0] == "--":
        command_line = command_line[1:]
    if not command_line:
        raise UsageError("nothing to run: put the command after --, e.g. modulelens run -t mlp -- python train.py")
    if not target and not list_modules:
        raise UsageError("give at least one --target/-t (modulelens run --list-modules -- CMD prints the module names)")
    config = RunConfig(targets=list(target or []), warmup=warmup, max_calls=max_calls,
                       exit_after_capture=exit_after_capture, repo=repo, name=name, ranks=ranks, strict=strict,
                       tags=list(tag or []), backward=backward, shape_only_over=shape_only_over, max_bytes=max_bytes,
                       list_modules=list_modules, depth=depth, op_trace=op_trace, op_trace_values=op_trace_values,
                       settle_at_return=settle_at_return)
    outcome = run_command(command_line, config, quiet=as_json)
    if outcome.get("stopped"):
        raise UsageError(outcome["stopped"])
    if list_modules:
        if not outcome["roots"]:
            raise NothingCapturedError(f"{shlex.join(command_line)} called no torch.nn.Module "
                                       f"(exit code {outcome['exit_code']})")
        emit("run", as_json, {"roots": outcome["roots"], "exit_code": 0}, _render_modules)
        return
    if outcome["exit_code"] == 0 and not outcome["saved"] and not outcome["kept"]:
        reasons = [_missing_line(t, outcome) for t in outcome["missing_targets"]]
        reasons += [failure for process in outcome["processes"] for failure in process.get("failed", [])]
        if not outcome["processes"]:
            reasons.append("no Python process of the command started with capture on")
        raise NothingCapturedError("the command finished but no target was captured: "
                                   + ("; ".join(reasons) or "no capture was saved or uploaded"))
    if outcome["kept"] and outcome["exit_code"] == 0:
        # The job ran; captures did not reach the remote repo asked for: an error (exit 7), after the
        # tables of what was saved and kept, whose message is how to finish their delivery.
        if not as_json:
            _render_run(safe_tree(outcome))
        first = outcome["kept"][0]
        raise RemoteRepoError(f"{first['reason']}: the job ran and {len(outcome['kept'])} capture(s) are kept in "
                              f"{first['kept_in']}; push them with: {' && '.join(outcome['push_commands'])}")
    emit("run", as_json, outcome, _render_run)
    raise typer.Exit(outcome["exit_code"])


def _missing_line(pattern: str, outcome: dict[str, Any]) -> str:
    """``'lin' matched no module; closest: 1.lin (Linear)`` (or the hint to list the modules)."""
    if pattern in outcome.get("matched_not_captured", ()):
        why = outcome.get("not_captured", {}).get(pattern)  # what happened, from the job's tracer
        return f"{pattern!r} matched a module but was not captured: {why}" if why else \
            f"{pattern!r} matched a module, but it finished no recorded call"
    close = ", ".join(f"{n or '<root>'} ({c.rsplit(':', 1)[-1]})" for n, c in outcome["suggestions"].get(pattern, []))
    models = ", ".join(dict.fromkeys(root["class"].rsplit(":", 1)[-1] for root in outcome["roots"]))
    if close:
        return f"{pattern!r} matched no module of the models the job called ({models}); closest: {close}"
    if outcome["roots"]:
        return (f"{pattern!r} matched no module of the models the job called ({models}; see modulelens run "
                "--list-modules -- CMD)")
    return f"{pattern!r} matched no module: the command called no torch.nn.Module"


def _render_run(r: dict[str, Any]) -> None:
    from rich.markup import escape

    for entries, title in ((r["saved"], f"captured into {r['repo']}"),
                           (r["kept"], f"kept in {r['kept'][0]['kept_in']}" if r["kept"] else "")):
        if not entries:
            continue
        table = rich_table(title=title)
        table.add_column("ref", no_wrap=True)
        table.add_column("module class")
        table.add_column("calls")
        for s in entries:
            table.add_row(s["ref"], s.get("module_class", "").rsplit(":", 1)[-1], str(s.get("calls", "")))
        err_console.print(table)
    for pattern in r["missing_targets"]:
        err_console.print(f"[yellow]warning:[/yellow] {escape(_missing_line(pattern, r))}", highlight=False)


def _render_modules(r: dict[str, Any]) -> None:
    """The names ``-t`` accepts, as plain aligned text: never cut (a rich table cut long class paths
    to the terminal's width), so each line can be copied whole."""
    root = r["roots"][0]
    echo(f"modules of {root['class']} (the first model called)", bold=True)
    rows = [[qualified or "<root>", cls] for qualified, cls in root["modules"]]
    echo("\n".join(text_table(["qualified name", "class"], rows, fit=False)))
    echo("capture one: modulelens run -t NAME_OR_CLASS -- CMD ('*' crosses dots; --depth N limits it)")


@command(app, "demo")
def demo_cmd(
    repo: RepoOpt = None,
    steps: Annotated[int, typer.Option(help="Training steps to run.")] = 30,
    as_json: JsonOpt = False,
) -> None:
    """The main job: train a small recommendation model under capture, then reload and replay in a fresh process."""
    from modulelens.demo.run import run_demo

    result = run_demo(repo=repo, steps=steps, quiet=as_json)
    if as_json:
        emit_json("demo", result=result)
    if not result["replay"]["passed"]:
        raise typer.Exit(1)

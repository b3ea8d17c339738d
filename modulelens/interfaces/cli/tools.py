"""Tool commands: ``profile``, ``verify``, ``diff``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modulelens.format.human import human_bytes
from modulelens.format.human import human_number as _num
from modulelens.interfaces import session
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import (
    AtolOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    OracleFactorOpt,
    RepoOpt,
    RtolOpt,
    StoreOpt,
    TrustOpt,
    UlpsOpt,
)
from modulelens.interfaces.output import console, emit, rich_table, steps

app = typer.Typer()


# ------------------------------------------------------------------------------------- profile


@command(app, "profile")
def profile_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    repo: RepoOpt = None,
    trust_source: TrustOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    call: Annotated[int, typer.Option(help="Which recorded call to run (position in the capture).")] = 0,
    backward: Annotated[bool, typer.Option("--backward", help="Time forward+backward, not forward only.")] = False,
    compile_: Annotated[bool, typer.Option("--compile", help="Run under torch.compile.")] = False,
    compile_backend: Annotated[str, typer.Option(help="torch.compile backend for --compile.")] = "inductor",
    warmup: Annotated[int, typer.Option(help="Untimed iterations first.")] = 5,
    iters: Annotated[int | None, typer.Option(help="Timed iterations (default: about one second's worth).")] = None,
    batch_sizes: Annotated[str | None, typer.Option(
        help="Sweep the batch dimension on synthetic inputs: 1,8,64.")] = None,
    plot: Annotated[str | None, typer.Option(
        help="Write a PNG of latency/throughput vs batch size (needs --batch-sizes).")] = None,
    trace: Annotated[str | None, typer.Option(help="Write a Chrome trace (chrome://tracing, Perfetto).")] = None,
    top: Annotated[int, typer.Option(help="How many top operators to list.")] = 15,
    store: StoreOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Latency (median/p10/p90), peak memory, FLOPs, bytes, top ops of a captured module; batch sweeps."""
    from modulelens.tools.profile import profile
    from modulelens.tools.timing import TimingConfig

    sizes = session.parse_int_list(batch_sizes, "--batch-sizes", positive=True)
    with steps(not as_json) as step:
        step(f"loading {ref}: importing torch and the module's code, rebuilding it")
        capture = session.load_capture(ref, repo, device=device, dtype=dtype, trust_source=trust_source)
        report = profile(capture, call=call, backward=backward, compile=compile_backend if compile_ else False,
                         timing=TimingConfig(warmup=warmup, iters=iters), batch_sizes=sizes, plot=plot, trace=trace,
                         top=top, store=store, progress=step)

    emit("profile", as_json, report.to_dict(), _render_profile)


def _render_profile(r: dict[str, Any]) -> None:
    """The profile report as rich tables."""
    from rich.markup import escape

    lat = r["latency"]
    compiled = f", torch.compile({r['compiled']})" if r["compiled"] else ""
    console.print(f"[bold]profile {escape(r['ref'])}[/bold] call {r['call_index']} on {r['device']}"
                  f"{' ' + r['dtype'] if r['dtype'] else ''} — {r['mode']}{compiled}")
    table = rich_table(show_header=False)
    table.add_column("metric")
    table.add_column("value")
    table.add_row("latency", f"median {lat['median_ms']:.4g} ms   p10 {lat['p10_ms']:.4g}   "
                             f"p90 {lat['p90_ms']:.4g}   ({lat['iterations']} iterations, {lat['warmup']} warm-up)")
    if r["compile_seconds"] is not None:
        table.add_row("first call (compile)", f"{r['compile_seconds']:.2f} s")
    peak = r["memory"].get("peak_bytes")
    table.add_row("peak memory", ("-" if peak is None else human_bytes(peak))
                  + f"   [dim]({r['memory'].get('source', 'see method')})[/dim]")
    table.add_row("FLOPs", _num(r["flops"]["total"]) + ("   [yellow](lower bound)[/yellow]"
                                                        if r["flops"]["uncounted_compute_ops"] else ""))
    table.add_row("bytes moved", human_bytes(r["bytes_moved"]["total"]) + "   [dim](eager, no fusion)[/dim]")
    table.add_row("achieved", _num(r["achieved_flops_per_s"], "FLOP/s"))
    table.add_row("arithmetic intensity", _num(r["arithmetic_intensity"], "FLOP/byte"))
    if r["batch_size"] is not None:
        table.add_row("recorded batch size", str(r["batch_size"]))
    console.print(table)
    if r["flops"]["uncounted_compute_ops"]:
        console.print("no FLOP formula (not counted): " + ", ".join(r["flops"]["uncounted_compute_ops"]))
    ops = rich_table(title="top operators (self time per iteration)")
    for col in ("operator", "calls/iter", "self ms", "total ms", "%"):
        ops.add_column(col)
    for op in r["top_ops"]:
        ops.add_row(escape(op["name"]), f"{op['calls_per_iter']:g}", f"{op['self_ms_per_iter']:.4g}",
                    f"{op['total_ms_per_iter']:.4g}", f"{op['percent']:.1f}")
    console.print(ops)
    if r["batch_sweep"]:
        sweep = rich_table(title="batch sweep (synthetic inputs)")
        for col in ("batch", "median ms", "p10", "p90", "samples/s", "FLOP/s"):
            sweep.add_column(col)
        for row in r["batch_sweep"]:
            if row.get("median_ms") is None:
                sweep.add_row(str(row["batch_size"]), f"[red]{row.get('error')}[/red]", "", "", "", "")
                continue
            sweep.add_row(str(row["batch_size"]), f"{row['median_ms']:.4g}", f"{row['p10_ms']:.4g}",
                          f"{row['p90_ms']:.4g}", _num(row["throughput_per_s"]), _num(row["achieved_flops_per_s"]))
        console.print(sweep)
    for label, key in (("plot", "plot"), ("trace", "trace"), ("report", "report_path")):
        if r.get(key):
            console.print(f"{label}: {escape(r[key])}", highlight=False, soft_wrap=True)
    for note in r["notes"]:
        console.print(f"note: {escape(note)}", highlight=False)


# ------------------------------------------------------------------------------------- verify


@command(app, "verify")
def verify_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    candidate: Annotated[str, typer.Option("--candidate", "-c",
                                           help="path/to/file.py:ClassName or package.module:ClassName")],
    repo: RepoOpt = None,
    trust_source: TrustOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    ulps: UlpsOpt = None,
    oracle: Annotated[bool | None, typer.Option(
        "--oracle/--no-oracle", help="Judge float outputs by their error against a float64 run of the original, within "
                                     "k times the recording's own (docs/tools.md, \"Verdicts in ULPs\"); default: on "
                                     "for float16/bfloat16/float8 outputs unless --rtol/--atol/--ulps.")] = None,
    oracle_factor: OracleFactorOpt = None,
    iters: Annotated[int, typer.Option(help="Timed iterations per call for reference and candidate.")] = 20,
    timing: Annotated[bool, typer.Option("--timing/--no-timing", help="Time reference and candidate.")] = True,
    eval_mode: Annotated[bool | None, typer.Option("--eval/--train",
                                                   help="Run every call in eval or training mode (default: as recorded).")] = None,
    store: StoreOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Check a candidate implementation against every recorded call (exit 0 only on PASS; 1 on FAIL, or when nothing
    recorded could be compared: UNVERIFIED, "cannot verify: ...")."""
    from modulelens.restore.compare import describe_ulps, parse_ulps
    from modulelens.tools.timing import TimingConfig
    from modulelens.tools.verify import verify

    ulp_tolerance = None if ulps is None else parse_ulps(ulps)
    with steps(not as_json) as step:
        step(f"loading {ref}: importing torch and the module's code, rebuilding it")
        capture = session.load_capture(ref, repo, device=device, dtype=dtype, trust_source=trust_source)
        step(f"running {candidate} on the {len(capture.calls)} recorded call(s)"
             + (f" and timing it against the original ({iters} iterations each)" if timing else ""))
        report = verify(capture, candidate, rtol=rtol, atol=atol,
                        timing=TimingConfig(warmup=3, iters=iters) if timing else None, store=store,
                        mode="recorded" if eval_mode is None else ("eval" if eval_mode else "train"),
                        ulps=ulp_tolerance, oracle=oracle, oracle_factor=oracle_factor)

    def render(r: dict[str, Any]) -> None:
        from rich.markup import escape

        styles = {"PASS": "green", "FAIL": "red", "UNVERIFIED": "yellow"}
        style = styles[r["status"]]
        tolerance = "per-dtype tolerances" if rtol is None and atol is None else f"rtol={rtol}, atol={atol}"
        if ulp_tolerance is not None:
            tolerance = f"within {describe_ulps(ulp_tolerance)}"
        if any(leaf.get("rule") == "oracle" for c in r["calls"] for leaf in c["leaves"]):
            tolerance = f"the float64 oracle rule, else {tolerance}"
        console.print(f"[{style}]{r['status']}[/{style}] {escape(r['candidate'])} "
                      f"(built with {r['built_with']}) against {escape(r['ref'])} on {r['device']} ({tolerance})",
                      highlight=False)
        if r["error"]:
            console.print(f"[red]{escape(r['error'])}[/red]")
        for reason in r["unverified"]:
            console.print(f"[yellow]cannot verify:[/yellow] {escape(reason)}", highlight=False)
        if r["calls"]:
            table = rich_table()
            for col in ("call", "result", "max abs err", "mean abs err", "max rel err", "max ULPs", "ref ms", "cand ms",
                        "speedup"):
                table.add_column(col)
            for c in r["calls"]:
                status = c["status"].upper() if c["status"] != "pass" else "pass"
                table.add_row(str(c["index"]), f"[{styles[c['status'].upper()]}]{status}[/{styles[c['status'].upper()]}]",
                              *(_num(c[k]) for k in ("max_abs_error", "mean_abs_error", "max_rel_error")),
                              _num(c.get("max_ulps")), _num(c["reference_ms"]), _num(c["candidate_ms"]),
                              "-" if c["speedup"] is None else f"{c['speedup']:.2f}x")
            console.print(table)
        for line in r["failures"]:
            if line != r["error"]:
                console.print(f"  [red]✗[/red] {escape(line)}", highlight=False)
        if r["speedup"] is not None:
            console.print(f"speedup: {r['speedup']:.2f}x (reference median / candidate median)")
        for note in r["notes"]:
            console.print(f"note: {escape(note)}", highlight=False)

    emit("verify", as_json, report.to_dict(), render)
    if not report.passed:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------- diverge


@command(app, "diverge")
def diverge_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    candidate: Annotated[str | None, typer.Option(
        "--candidate", "-c", help="Compare this rewrite (path/to/file.py:ClassName or package.module:ClassName) "
                                  "with the rebuilt module; without it, a replay with the recorded job's op trace.")] = None,
    call: Annotated[int | None, typer.Option("--call", min=0, help="Which recorded call (position; default: "
                                                                    "every call, the first failing one located).")] = None,
    repo: RepoOpt = None,
    trust_source: TrustOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    store: StoreOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Name the first op where a rewrite (or this machine's replay) parts from the reference: module, op, source
    line, error in ULPs, and the last op that agreed (exit 1 when the outputs differ)."""
    from modulelens.tools.diverge import find_divergence

    with steps(not as_json) as step:
        step(f"loading {ref}: importing torch and the module's code, rebuilding it")
        capture = session.load_capture(ref, repo, device=device, dtype=dtype, trust_source=trust_source)
        step(f"running {candidate or 'the rebuilt module'} and the reference under an op trace")
        result = find_divergence(capture, candidate, call=call, rtol=rtol, atol=atol, store=store)

    def render(r: dict[str, Any]) -> None:
        from rich.markup import escape

        style = "green" if r["passed"] else "red"
        console.print(f"[{style}]{'PASS' if r['passed'] else 'FAIL'}[/{style}] {escape(r['compared'])} "
                      f"({escape(r['ref'])}, {len(r['calls'])} call(s))", highlight=False)
        for c in r["calls"]:
            line = "pass" if c["passed"] else (c["error"] or (c["divergence"] or {}).get("summary") or "FAIL")
            console.print(f"  call {c['index']}: {escape(line)}", highlight=False, soft_wrap=True)
            for detail in (c.get("divergence") or {}).get("details", []):
                console.print(f"    {escape(detail)}", highlight=False, soft_wrap=True)
        for note in r["notes"]:
            console.print(f"note: {escape(note)}", highlight=False)

    emit("diverge", as_json, result, render)
    if not result["passed"]:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------- diff


@command(app, "diff")
def diff_cmd(
    a: Annotated[str, typer.Argument(help="NAME[:vN|:alias] (the baseline)")],
    b: Annotated[str, typer.Argument(help="NAME[:vN|:alias] (compared with A)")],
    repo: RepoOpt = None,
    trust_source: TrustOpt = None,
    device: DeviceOpt = None,
    outputs: Annotated[bool, typer.Option("--outputs/--no-outputs", help="Replay B's module on A's inputs.")] = True,
    rtol: Annotated[float | None, typer.Option(help="Relative tolerance for outputs (default: per dtype).")] = None,
    atol: Annotated[float | None, typer.Option(help="Absolute tolerance for outputs (default: per dtype).")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="List unchanged tensors too.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Differences between two captures: constructor, weights, input statistics, outputs of B on A's inputs."""
    from modulelens.tools.diff import diff

    with steps(not as_json) as step:
        step(f"loading {a}: importing torch and the module's code, rebuilding it")
        first = session.load_capture(a, repo, device=device, trust_source=trust_source)
        step(f"loading {b}")
        second = session.load_capture(b, repo, device=device, trust_source=trust_source)
        step("comparing constructor arguments, weights and inputs" + (f"; running {b} on {a}'s inputs" if outputs else ""))
        report = diff(first, second, device=device, outputs=outputs, rtol=rtol, atol=atol)

    def render(r: dict[str, Any]) -> None:
        from rich.markup import escape

        s = r["summary"]
        console.print(f"[bold]diff {escape(r['a'])} -> {escape(r['b'])}[/bold]", highlight=False)
        if s["class_changed"]:
            console.print(f"class: {escape(r['class_a'])} -> {escape(r['class_b'])}", highlight=False)
        if r["constructor"]:
            table = rich_table(title="constructor arguments")
            for col in ("argument", "A", "B"):
                table.add_column(col)
            for c in r["constructor"]:
                table.add_row(escape(c["argument"]), escape(c["a"]), escape(c["b"]))
            console.print(table)
        else:
            console.print("constructor arguments: identical")
        rows = [t for t in r["tensors"] if show_all or t["status"] != "same"]
        if rows:
            table = rich_table(title="parameters and buffers (first recorded state)")
            table.add_column("tensor", overflow="fold")
            for col in ("status", "shape", "max abs diff", "‖a-b‖/‖a‖"):
                table.add_column(col)
            for t in rows:
                shape = str(t["shape_a"] or t["shape_b"])
                if t["shape_a"] and t["shape_b"] and t["shape_a"] != t["shape_b"]:
                    shape = f"{t['shape_a']} → {t['shape_b']}"
                kind = "" if t["kind"] == "parameter" else f" ({t['kind']})"
                table.add_row(escape(t["name"]) + kind, t["status"], shape, _num(t["max_abs_diff"]), _num(t["rel_norm"]))
            console.print(table)
        same = sum(t["status"] == "same" for t in r["tensors"])
        console.print(f"{same}/{s['tensors']} tensors identical")
        if r["inputs"]:
            table = rich_table(title="input statistics (all recorded calls)")
            for col in ("input", "mean A → B", "std A → B", "min A → B", "max A → B"):
                table.add_column(col)
            for row in r["inputs"]:
                da, db = row["a"] or {}, row["b"] or {}
                if "mean" not in da and "mean" not in db:
                    table.add_row(escape(row["leaf"]), escape(f"{da.get('values')} → {db.get('values')}"), "", "", "")
                    continue
                table.add_row(escape(row["leaf"]), *(f"{_num(da.get(k))} → {_num(db.get(k))}"
                                             for k in ("mean", "std", "min", "max")))
            console.print(table)
        if r["outputs"]:
            table = rich_table(title=escape(f"outputs: {r['b']} run on {r['a']}'s inputs vs {r['a']}'s recorded outputs"))
            for col in ("call", "result", "max abs err", "max rel err", "mean abs err", "detail"):
                table.add_column(col)
            for o in r["outputs"]:
                worst = next((leaf for leaf in o["leaves"] if not leaf["passed"]), None)
                table.add_row(str(o["index"]), "same" if o["same"] else "[yellow]differs[/yellow]",
                              _num(o["max_abs_error"]), _num(o["max_rel_error"]), _num(o["mean_abs_error"]),
                              escape(o["error"] or (f"{worst['path']}: {worst['message']}" if worst else "")))
            console.print(table)
        for note in r["notes"]:
            console.print(f"note: {escape(note)}", highlight=False)

    emit("diff", as_json, report.to_dict(), render)


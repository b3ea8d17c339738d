"""Kernel commands: ``modulelens export --format kernelbench`` and ``modulelens kernel verify|agent``.

``app`` holds the top-level ``export``; ``kernel_app`` is the ``kernel`` group (both assembled by ``root.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from modulelens.errors import UsageError
from modulelens.format.human import human_number as _num
from modulelens.interfaces import session
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import JsonOpt, OracleFactorOpt, RepoOpt, TrustOpt, UlpsOpt
from modulelens.interfaces.output import console, emit, err_console, rich_table

app = typer.Typer()

kernel_app = typer.Typer(
    name="kernel",
    help="Custom kernels for a captured module: verify a candidate, run KernelAgent on it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

P = ParamSpec("P")
R = TypeVar("R")


def kernel_command(name: str, context_settings: dict[str, object] | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``cli.command`` for ``modulelens kernel <name>`` (JSON ``command``: ``"kernel <name>"``)."""
    return command(kernel_app, name, json_name=f"kernel {name}", context_settings=context_settings)


CallsOpt = Annotated[str | None, typer.Option("--calls", help="Recorded calls to use, by position: 0,2,3 (default: all).")]
MaxCallsOpt = Annotated[int, typer.Option("--max-calls", help="Use at most this many recorded calls.")]
RtolOpt = Annotated[float | None, typer.Option("--rtol", help="Relative tolerance for every float output (default: by dtype).")]
AtolOpt = Annotated[float | None, typer.Option("--atol", help="Absolute tolerance for every float output (default: by dtype).")]


# ------------------------------------------------------------------------------------- export


@command(app, "export")
def export_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Problem folder to write.")],
    format: Annotated[str, typer.Option("--format", help="Export format (kernelbench: KernelBench/KernelAgent problem).")] = "kernelbench",
    calls: CallsOpt = None,
    max_calls: MaxCallsOpt = 8,
    inline: Annotated[bool, typer.Option("--inline/--no-inline", help="Inline the module's source (default) or import its class.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace the problem files of a non-empty folder.")] = False,
    check: Annotated[bool, typer.Option("--check/--no-check",
                                        help="Exec problem.py as KernelBench does; compare with the recorded outputs.")] = True,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    eval_mode: Annotated[bool | None, typer.Option("--eval/--train",
                                                   help="Put Model in eval or training mode (default: as recorded).")] = None,
    trust_source: TrustOpt = None,
    repo: RepoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a KernelBench/KernelAgent problem folder (problem.py, test, manifest, real data)."""
    from modulelens.kernels.export import check_problem_folder, export_kernelbench

    if format != "kernelbench":
        raise UsageError(f"unknown export format {format!r} (available: kernelbench)")
    check_problem_folder(output, overwrite=force)  # before loading: a refusal is immediate
    with _status(as_json) as step:
        step(f"loading {ref}")
        capture = session.load_capture(ref, repo, trust_source=trust_source)
        result = export_kernelbench(capture, output, repo=capture.repo, calls=session.parse_int_list(calls, "--calls"),
                                    max_calls=max_calls, inline=inline, overwrite=force, check=check, rtol=rtol, atol=atol,
                                    mode="recorded" if eval_mode is None else ("eval" if eval_mode else "train"),
                                    progress=step)
    emit("export", as_json, result.to_dict(), _render_export)


def _render_export(result: dict[str, Any]) -> None:
    m = result["manifest"]
    console.print(f"[bold]{m['capture']['ref']}[/bold] -> {result['directory']}")
    table = rich_table(show_header=True)
    table.add_column("file")
    table.add_column("hash")
    for name, digest in m["files"].items():
        table.add_row(name, digest[:22] + "…")
    console.print(table)
    console.print(f"Model: {m['model']['class_expr']} ({m['model']['source']}), "
                  f"{len(m['calls'])} recorded call(s), forward({', '.join(m['model']['forward_arguments'])})")
    console.print(f"KernelAgent convention: {m['kernel_function_signature']}")
    check = m.get("self_check")
    if check:
        ok = check.get("reproduces_recorded_outputs")
        console.print("[green]problem.py reproduces the recorded outputs[/green]" if ok else
                       f"[red]problem.py does not reproduce the recorded outputs[/red] {check.get('error', '')}")
    if m["kernelbench_compatible"]:
        console.print(f"[green]KernelBench compatible[/green] (precision {m['kernelbench_precision']})")
    else:
        console.print("[yellow]not KernelBench compatible:[/yellow]")
        for reason in m["kernelbench_incompatible_reasons"]:
            console.print(f"  - {reason}", highlight=False)
    for note in m["notes"]:
        console.print(f"note: {note}", highlight=False)
    console.print(f"KernelAgent: {m['commands']['kernelagent']}", highlight=False, soft_wrap=True)
    console.print(f"verify:      {m['commands']['verify']}", highlight=False, soft_wrap=True)


# ------------------------------------------------------------------------------------- verify


@kernel_command("verify")
def kernel_verify_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    candidate: Annotated[Path, typer.Option("--candidate", "-c", help="ModelNew/kernel_function .py file, or KernelAgent's result JSON.")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds before the candidate's process is killed.")] = 300.0,
    reference_timeout: Annotated[float | None, typer.Option("--reference-timeout",
                                                            help="Seconds for the reference process (default: max(timeout, 120)).")] = None,
    device: Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda when available).")] = None,
    calls: CallsOpt = None,
    max_calls: MaxCallsOpt = 8,
    random: Annotated[int, typer.Option("--random", help="Seeded random inputs of the recorded shapes/dtypes.")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random inputs.")] = 0,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    ulps: UlpsOpt = None,
    oracle: Annotated[bool, typer.Option(
        "--oracle/--no-oracle", help="Judge float outputs by their error against a float64 run of the reference "
                                     "(docs/kernels.md, \"Verdicts in ULPs\"); --no-oracle: fixed tolerances.")] = True,
    oracle_factor: OracleFactorOpt = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up calls before timing (CUDA).")] = 10,
    trials: Annotated[int, typer.Option("--trials", help="Timed trials per sample (CUDA).")] = 100,
    entry: Annotated[str, typer.Option("--entry", help="auto, ModelNew or kernel_function.")] = "auto",
    allow: Annotated[list[str] | None, typer.Option("--allow", help="Static-check rule to downgrade to a warning; repeatable.")] = None,
    allow_torch_ops: Annotated[bool, typer.Option("--allow-torch-ops",
                                                  help="Accept heavy ops (matmul/conv/attention) run through PyTorch.")] = False,
    store: Annotated[bool, typer.Option("--store/--no-store", help="Keep the report with the capture version.")] = True,
    trust_source: TrustOpt = None,
    repo: RepoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a kernel candidate on the recorded calls and random inputs (exit 0 only on PASS; 1 when it fails, or
    when a recorded output stored shape-only agrees in shape, dtype and statistics but has no values to compare:
    UNVERIFIED, "cannot verify: ...")."""
    from modulelens.kernels.options import CandidatePolicy, KernelChecks
    from modulelens.kernels.verify import verify_kernel
    from modulelens.restore.compare import parse_ulps
    from modulelens.tools.timing import TimingConfig

    checks = KernelChecks(calls=session.parse_int_list(calls, "--calls"), max_calls=max_calls, random_samples=random,
                          seed=seed, rtol=rtol, atol=atol, ulps=None if ulps is None else parse_ulps(ulps),
                          oracle=oracle, oracle_factor=oracle_factor)
    policy = CandidatePolicy(timeout=timeout, reference_timeout=reference_timeout, allow=allow or (),
                      allow_torch_ops=allow_torch_ops)
    with _status(as_json) as step:
        step(f"loading {ref}")
        capture = session.load_capture(ref, repo, trust_source=trust_source)
        report = verify_kernel(capture, candidate, repo=capture.repo, device=device, entry=entry, checks=checks,
                               timing=TimingConfig(warmup=warmup, iters=trials), policy=policy, store=store,
                               progress=step)
    emit("kernel verify", as_json, report.to_dict(), render_kernel_report)
    if not report.passed:
        raise typer.Exit(1)


@contextlib.contextmanager
def _status(as_json: bool) -> Iterator[Callable[[str], None]]:
    """A status line on stderr naming the step that runs (a terminal only: nothing with ``--json``
    or when stderr is a file or a pipe)."""
    if as_json or not err_console.is_terminal:
        yield lambda step: None
        return
    with err_console.status("starting") as status:
        yield lambda step: status.update(f"{step}…")


def render_kernel_report(d: dict[str, Any]) -> None:
    """The verification report as rich tables."""
    from rich.markup import escape

    status = d.get("status") or ("PASS" if d["passed"] else "FAIL")  # reports stored before UNVERIFIED existed
    style = {"PASS": "green", "FAIL": "red", "UNVERIFIED": "yellow"}[status]
    cand = d["candidate"]
    console.print(f"[{style}]{status}[/{style}] {cand['entry'] or '?'} ({cand['backend']}) "
                  f"from {cand['origin']} against {d['ref']} on {d['runtime']['device']}", highlight=False)
    for reason in d.get("unverified", []):
        console.print(f"[yellow]cannot verify:[/yellow] {escape(reason)}", highlight=False, soft_wrap=True)
    static = d["static"]
    if static["errors"] or static["warnings"]:
        table = rich_table(title="static check")
        for col in ("severity", "line", "rule", "message"):
            table.add_column(col)
        for f in static["errors"] + static["warnings"]:
            table.add_row("[red]error[/red]" if f["severity"] == "error" else "[yellow]warning[/yellow]",
                          str(f["line"]), f["rule"], f["message"])
        console.print(table)
    timing = d.get("timing", {})
    by_sample = {row["sample"]: row for row in timing.get("samples", [])} if timing.get("measured") else {}
    table = rich_table(title="samples")
    columns = ["sample", "kind", "result", "max abs err", "max rel err", "max ULPs", "ok at 1e-3"]
    if by_sample:
        columns += ["reference ms (p10-p90)", "candidate ms (p10-p90)", "speedup (range)"]
    columns.append("detail")
    for col in columns:
        table.add_column(col)
    for s in d["samples"]:
        result = ("[yellow]skip[/yellow]" if s["passed"] is None else "[green]pass[/green]" if s["passed"]
                  else "[yellow]UNVERIFIED[/yellow]" if s.get("status") == "unverified" else "[red]FAIL[/red]")
        detail = s.get("skipped") or (s.get("error") or "").split("\n")[0] or next(
            (f"{x['path']}: {x.get('message')}" for x in s.get("leaves", []) if not x["passed"] or x.get("compared") is False),
            "") or (
            f"modified {', '.join(s['mutated_inputs'])}" if s.get("mutated_inputs") else "")
        row = [s["sample"], s["kind"], result, _num(s.get("max_abs_error")), _num(s.get("max_rel_error")),
               _num(s.get("max_ulps")), "-" if s.get("passes_at_1e-3") is None else ("yes" if s["passes_at_1e-3"] else "no")]
        if by_sample:
            t = by_sample.get(s["sample"], {})
            row += [_spread(t.get("reference")), _spread(t.get("candidate")),
                    f"{_num(t.get('speedup'))} ({_num(t.get('speedup_low'))}-{_num(t.get('speedup_high'))})"
                    if t.get("speedup") is not None else "-"]
        row.append(detail if len(detail) <= 60 else detail[:57] + "...")
        table.add_row(*row)
    console.print(table)
    for failure in d["failures"]:
        console.print(f"[red]failure:[/red] {failure}", highlight=False, soft_wrap=True)
    if d.get("divergence"):  # docs/tools.md, "First divergence"
        console.print(f"{d['divergence']['sample']}: {d['divergence']['summary']}", highlight=False, soft_wrap=True,
                      markup=False)
    if timing.get("measured"):
        console.print(f"speedup (geometric mean over {timing['speedup_samples']} passing samples): "
                      f"{_num(timing['speedup_geomean'])}, per sample p10 {_num(timing.get('speedup_p10'))} / median "
                      f"{_num(timing.get('speedup_median'))} / p90 {_num(timing.get('speedup_p90'))}  "
                      f"[CUDA events, {timing['trials']} trials, L2 flushed]", highlight=False)
        for reason in timing.get("noise", []):
            console.print(f"[yellow]timings too noisy to trust:[/yellow] {reason}", highlight=False)
    else:
        console.print(f"timing: {timing.get('reason', 'not measured')}", highlight=False)
    if d.get("review_required"):
        for reason in d["review_reasons"]:
            console.print(f"[yellow]review:[/yellow] {reason}", highlight=False)
    console.print(f"verdicts: {', '.join(f'{k}: {_rule(v)}' for k, v in d['tolerances'].items())}", highlight=False)
    if d.get("failed_checks"):
        console.print(f"failed checks: {', '.join(d['failed_checks'])}", highlight=False)
    for note in d["notes"]:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    if d.get("report_path"):
        console.print(f"report stored: {d['report_path']}", highlight=False)


def _rule(row: dict[str, Any]) -> str:
    """How one output dtype is judged, in words (the report's ``tolerances`` row)."""
    rule = row.get("rule", "exact" if row["exact"] else "tolerance")
    fixed = f"rtol={row['rtol']:g} atol={row['atol']:g}"
    if rule == "oracle":
        return f"within {row['oracle_factor']:g}x the reference's error against a float64 oracle (else {fixed})"
    if rule == "ulps":
        return f"within {row['ulps']:g} ULPs"
    return "exact" if rule == "exact" else fixed


def _spread(stats: dict[str, Any] | None) -> str:
    """``median (p10-p90)`` of one timed series, in ms."""
    if not stats:
        return "-"
    return f"{_num(stats.get('median_ms'))} ({_num(stats.get('p10_ms'))}-{_num(stats.get('p90_ms'))})"


# ------------------------------------------------------------------------------------- agent


def kernelagent_available() -> bool:
    """Whether KernelAgent's ``Fuser`` package can be imported here."""
    try:
        return importlib.util.find_spec("Fuser") is not None and importlib.util.find_spec("Fuser.auto_agent") is not None
    except (ImportError, ValueError):
        return False


def _agent_json(text: str) -> dict[str, Any] | None:
    """The result object ``Fuser.auto_agent`` prints last on stdout."""
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else None
    except ValueError:
        pass
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                data = json.loads("\n".join(lines[i:]))
                return data if isinstance(data, dict) else None
            except ValueError:
                continue
    return None


@kernel_command("agent", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def agent_cmd(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Problem folder (default: ./kernel-problems/NAME-vN).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the problem files of a non-empty folder.")] = False,
    run: Annotated[bool, typer.Option("--run/--no-run",
                                      help="Run KernelAgent when it is installed (default) or only print the commands.")] = True,
    agent_timeout: Annotated[float, typer.Option("--agent-timeout", help="Seconds before KernelAgent is stopped.")] = 7200.0,
    timeout: Annotated[float, typer.Option("--timeout", help="Verifier timeout for the candidate (seconds).")] = 300.0,
    calls: CallsOpt = None,
    repo: RepoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Export the problem, run KernelAgent on it (if installed; extra args after -- go to it), verify and store its kernel."""
    from modulelens.kernels.export import check_problem_folder, export_kernelbench
    from modulelens.kernels.options import CandidatePolicy
    from modulelens.kernels.process import worker_env
    from modulelens.kernels.verify import verify_kernel

    store, ref = session.open_ref(ref, repo)
    name, version = session.resolve(store, ref)
    directory = output or Path("kernel-problems") / f"{name.replace('/', '__')}-v{version}"
    check_problem_folder(directory, overwrite=force)  # an earlier run's problem and kernel stay unless --force
    exported = export_kernelbench(f"{name}:v{version}", directory, repo=store, calls=session.parse_int_list(calls, "--calls"),
                                  overwrite=force)
    manifest = exported.manifest
    extra = [a for a in ctx.args if a != "--"]
    agent_command = [sys.executable, "-m", "Fuser.auto_agent", "--problem", str(exported.problem),
                     "--test-paths", str(exported.test), *extra]
    result: dict[str, Any] = {"problem": exported.to_dict(), "kernelagent_available": kernelagent_available(),
                              "agent_command": agent_command, "agent": None, "verify": None}
    verify_hint = f"modulelens kernel verify {manifest['capture']['ref']} --candidate {directory.absolute() / 'agent_result.json'}" + (
        f" --repo {store.location}" if repo else "")
    result["commands"] = [
        "git clone https://github.com/meta-pytorch/KernelAgent && pip install -e KernelAgent   # needs a CUDA/XPU GPU",
        "export OPENAI_API_KEY=...   # or ANTHROPIC_API_KEY=... (KernelAgent reads .env too)",
        f"cd {directory.absolute()} && python -m Fuser.auto_agent --problem {exported.problem} "
        f"--test-paths {exported.test} > agent_result.json",
        verify_hint,
    ]
    if result["kernelagent_available"] and run:
        if not as_json:
            err_console.print(f"running KernelAgent on {exported.problem} (this calls an LLM and may take long)…")
        env = worker_env("cuda", candidate=False)
        try:
            completed = subprocess.run(agent_command, cwd=exported.directory, env=env, stdout=subprocess.PIPE,
                                       stderr=None if not as_json else subprocess.DEVNULL, text=True, timeout=agent_timeout)
            stdout, returncode = completed.stdout, completed.returncode
        except subprocess.TimeoutExpired as error:
            stdout = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
            returncode = None
        (exported.directory / "agent_stdout.txt").write_text(stdout)
        data = _agent_json(stdout)
        result["agent"] = {"returncode": returncode, "timed_out": returncode is None,
                           "success": bool(data and data.get("success")), "route": data.get("route") if data else None,
                           "result_json": str(exported.directory / "agent_result.json") if data else None}
        if data is not None:
            (exported.directory / "agent_result.json").write_text(json.dumps(data, indent=2))
        if data and data.get("kernel_code"):
            kernel = exported.directory / "kernel.py"
            kernel.write_text(data["kernel_code"])
            result["agent"]["kernel"] = str(kernel)
            report = verify_kernel(manifest["capture"]["ref"], kernel, repo=store, policy=CandidatePolicy(timeout=timeout))
            result["verify"] = report.to_dict()
    emit("kernel agent", as_json, result, _render_agent)
    verified = result["verify"]
    if result["agent"] is not None and not (verified and verified["passed"]):
        raise typer.Exit(1)


def _render_agent(result: dict[str, Any]) -> None:
    _render_export(result["problem"])
    if result["agent"] is None:
        why = "KernelAgent (Fuser) is not installed here" if not result["kernelagent_available"] else "--no-run"
        console.print(f"\n[bold]{why}; run it yourself:[/bold]")
        for line in result["commands"]:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        return
    agent = result["agent"]
    console.print(f"KernelAgent: success={agent['success']} route={agent['route']} exit={agent['returncode']}"
                  + (" (timed out)" if agent["timed_out"] else ""))
    if result["verify"] is not None:
        render_kernel_report(result["verify"])
    else:
        console.print("[red]KernelAgent produced no kernel to verify[/red]")


"""``modulelens kernel verify``: check a kernel candidate against a captured module (see docs/kernels.md).

A candidate is a Python file defining ``class ModelNew`` (KernelBench style: same constructor and
forward arguments as the reference; the captured weights are loaded into it by name) or
``def kernel_function`` (KernelAgent style: called as ``kernel_function(*forward_args,
*parameters, *buffers)``), or a KernelAgent ``auto_agent`` result JSON with ``kernel_code``.

Verification:

1. a static AST check rejects known reward hacks (:mod:`modulelens.kernels.static_check`);
2. a fresh *reference* process rebuilds the module, runs it on up to 8 recorded calls and on 5
   seeded random inputs of the same shapes and dtypes, and times it on CUDA;
3. a fresh *candidate* process (killed after ``timeout`` seconds) runs the candidate on clones of
   the same inputs; it never holds the reference module or an expected output, and imports of
   modulelens and of the reference's module are blocked there. It checks that inputs are not
   modified, that outputs are plain tensors on the device, that Triton kernels really launch,
   that no threads are left running and no timer is replaced, and that two runs agree;
4. this process compares the outputs: recorded calls against the recorded outputs, random inputs
   against the reference, each floating output judged in ULPs against a float64 oracle of the
   reference (:mod:`modulelens.restore.oracle`; fixed per-dtype tolerances where there is none, or
   when ``rtol``/``atol``/``ulps`` are given); it turns the candidate worker's exploit probes into
   named failures (:mod:`modulelens.kernels.exploits`); on CUDA it reports CUDA-event timings (L2
   flushed before each trial) and the speedups.

The report is stored with the capture version (``repo.add_report(ref, "kernel", ...)``), so every
candidate tried on a module is kept as its kernel history.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import CandidateError, UsageError
from modulelens.format.op_trace import OpTrace
from modulelens.format.tensors import dtype_name, hash_bytes
from modulelens.format.validate import validate_op_trace
from modulelens.kernels.exchange import decode_arg, load_tensors, save_tensors
from modulelens.kernels.exploits import (
    cached_outputs,
    degenerate,
    difference,
    environment_findings,
    fail,
    refill_findings,
    repeat_findings,
    sample_findings,
)
from modulelens.kernels.options import KERNEL_TIMING, CandidatePolicy, KernelChecks
from modulelens.kernels.problems import select_calls
from modulelens.kernels.process import run_isolated, worker_env
from modulelens.kernels.static_check import ReferenceInfo, check_source
from modulelens.repo import Repo
from modulelens.restore.compare import compare, default_tolerance, tolerance_table, ulp_limit
from modulelens.restore.context import call_context
from modulelens.restore.divergence import LOCATE_LIMITS, DivergenceRule, locate, trace_call
from modulelens.restore.loader import Capture, load
from modulelens.restore.oracle import OracleRun, oracle_factor
from modulelens.tools.timing import TimingConfig, compare_timings, timing_noise, timing_stats

SCHEMA = "modulelens.kernel-verify/1"
SPEEDUP_REVIEW = 10.0
LOOSE_FP32 = 1e-3
_SOURCE_LIMIT = 256 * 1024
# run by path as a plain script (python -P): importing it here would load its helpers for nothing
_CANDIDATE_WORKER = Path(__file__).absolute().with_name("worker_candidate.py")


@dataclass
class KernelReport:
    """The result of :func:`verify_kernel`; ``data`` is the JSON report (docs/kernels.md)."""

    data: dict[str, Any]

    @property
    def passed(self) -> bool:
        return bool(self.data.get("passed"))

    @property
    def failures(self) -> list[str]:
        return list(self.data.get("failures", []))

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def __str__(self) -> str:
        d = self.data
        lines = [f"kernel verify {d['ref']} {d['candidate']['path']}: {'PASS' if self.passed else 'FAIL'}"]
        lines += [f"  failure: {f}" for f in d.get("failures", [])]
        if d.get("divergence"):
            lines.append(f"  {d['divergence']['sample']}: {d['divergence']['summary']}")
        timing = d.get("timing", {})
        if timing.get("measured"):
            lines.append(f"  speedup (geometric mean): {timing.get('speedup_geomean')}")
        else:
            lines.append(f"  timing: {timing.get('reason')}")
        return "\n".join(lines)

    __repr__ = __str__


def read_candidate(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The candidate's source, and where it came from (a .py file, or the ``kernel_code`` of a
    KernelAgent ``auto_agent`` result JSON)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise CandidateError(f"candidate {file} does not exist")
    text = file.read_text()
    if file.suffix == ".json":
        try:
            data = json.loads(text[text.index("{"):]) if "{" in text else {}
        except ValueError as error:
            raise CandidateError(f"{file}: not a KernelAgent result JSON ({error})") from None
        code = data.get("kernel_code") if isinstance(data, dict) else None
        if not code:
            raise CandidateError(f"{file} has no kernel_code (KernelAgent found no kernel: success="
                                  f"{data.get('success') if isinstance(data, dict) else None})")
        return code, f"kernel_code of {file}"
    return text, str(file)


def _output_dtypes(capture: Capture, positions: Sequence[int]) -> list[str]:
    dtypes = []
    for position in positions:
        for leaf in pytree.tree_leaves(capture.calls[position].output):
            if isinstance(leaf, torch.Tensor):
                dtypes.append(dtype_name(leaf.dtype))
    return dtypes


def verify_kernel(
    ref: str | Capture,
    candidate: str | os.PathLike[str],
    *,
    repo: Repo | str | os.PathLike[str] | None = None,
    device: str | None = None,
    entry: str = "auto",
    checks: KernelChecks = KernelChecks(),
    timing: TimingConfig = KERNEL_TIMING,
    policy: CandidatePolicy = CandidatePolicy(),
    store: bool = True,
    progress: Callable[[str], None] | None = None,
) -> KernelReport:
    """Verify a kernel candidate file against capture ``ref`` and store the report.

    Args:
        ref: a capture ref or a loaded :class:`Capture`.
        candidate: a ``.py`` file (``ModelNew`` or ``kernel_function``) or a KernelAgent result JSON.
        repo: the repository (default: ``$MODULELENS_REPO`` or the default path).
        device: ``"cuda"``/``"cpu"`` (default: CUDA when available).
        entry: ``"auto"``, ``"ModelNew"`` or ``"kernel_function"``.
        checks: which calls and random inputs are checked, seed and tolerances (:class:`KernelChecks`).
        timing: ``warmup`` untimed calls and ``iters`` timed trials on CUDA (a fixed ``iters`` is
            required: reference and candidate are timed alike).
        policy: process timeouts and accepted static-check findings (:class:`CandidatePolicy`).
        store: store the report with the capture version.
        progress: called with a one-line description of each step as it starts (the CLI shows it
            as a status line on a terminal); the candidate's step names the sample it runs.

    Returns:
        A :class:`KernelReport` (``passed``, ``failures``, the JSON report in ``data``).

    Raises:
        UsageError: a bad ``entry`` or ``timing`` without ``iters``.
        CandidateError: a missing or unreadable candidate.
        ModulelensError: a capture that cannot be loaded or has no usable calls (a subclass).

    Example::

        report = verify_kernel("ranker/top_mlp:v3", "kernel.py", checks=KernelChecks(max_calls=2),
                               policy=CandidatePolicy(timeout=60))
        print(report)                  # PASS/FAIL, failures, speedup
        assert report.passed, report.failures
    """
    if entry not in ("auto", "ModelNew", "kernel_function"):
        raise UsageError(f"entry must be auto, ModelNew or kernel_function, not {entry!r}")
    if timing.iters is None:
        raise UsageError("kernel verify times a fixed number of trials: pass TimingConfig(iters=N)")
    if isinstance(ref, Capture):
        capture, store_repo = ref, ref.repo
    else:
        store_repo = repo if isinstance(repo, Repo) else Repo(repo, create=False)
        capture = load(ref, repo=store_repo)
    say = progress or _silent
    source, origin = read_candidate(candidate)
    positions = select_calls(capture, checks.calls, checks.max_calls, same_state=False)
    output_dtypes = _output_dtypes(capture, positions)
    say("static check of the candidate")
    static = check_source(source, ReferenceInfo(capture.module_class, set(output_dtypes)), allow=policy.allow)
    settings = _Settings(device=device or ("cuda" if torch.cuda.is_available() else "cpu"), entry=entry,
                         checks=checks, warmup=timing.warmup, trials=timing.iters, policy=policy,
                         backend=static.backend, candidate_home=Path(candidate).expanduser().absolute().parent,
                         progress=say)
    report = _new_report(capture, candidate, source, origin, static, output_dtypes, settings)
    for finding in static.errors:
        fail(report, "static", f"static check: {finding.rule} (line {finding.line}): {finding.message}")
    workdir = Path(tempfile.mkdtemp(prefix="modulelens-kernel-"))
    try:
        _run_workers(report, capture, store_repo, positions, workdir, source, settings)
    finally:
        if not os.environ.get("MODULELENS_KEEP_KERNEL_WORKDIR"):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            report["notes"].append(f"work directory kept at {workdir}")
    report["passed"] = not report["failures"] and report["correctness"].get("passed", False)
    if store:
        say("storing the report")
        path = store_repo.add_report(capture.ref, "kernel", report)
        report["report_path"] = str(path)
    return KernelReport(report)


@dataclass(frozen=True)
class _Settings:
    """How the workers run (validated by :func:`verify_kernel` and the option groups)."""

    device: str
    entry: str
    checks: KernelChecks
    warmup: int
    trials: int
    policy: CandidatePolicy
    backend: str
    candidate_home: Path | None
    progress: Callable[[str], None]

    @property
    def timing_on(self) -> bool:
        return self.device.startswith("cuda")


def _new_report(capture: Capture, candidate: str | os.PathLike[str], source: str, origin: str, static: Any,
                output_dtypes: list[str], settings: _Settings) -> dict[str, Any]:
    checks, policy = settings.checks, settings.policy
    return {
        "schema": SCHEMA,
        "kind": "kernel",
        "ref": capture.ref,
        "module_class": capture.module_class,
        "candidate": {"path": str(Path(candidate).expanduser().absolute()), "origin": origin,
                      "hash": hash_bytes(source.encode()), "entry": None, "backend": static.backend,
                      "source": source if len(source) <= _SOURCE_LIMIT else None},
        "passed": False,
        "failures": [],
        "failed_checks": [],
        "notes": [],
        "static": static.to_dict(),
        "tolerances": _verdict_table(output_dtypes or ["float32"], checks),
        "tolerance_overrides": {"rtol": checks.rtol, "atol": checks.atol, "ulps": checks.ulps,
                                "oracle": checks.uses_oracle, "oracle_factor": checks.oracle_factor},
        "settings": {"device": settings.device, "timeout_s": policy.timeout,
                     "reference_timeout_s": policy.reference_seconds, "max_calls": checks.max_calls,
                     "random_samples": checks.random_samples, "seed": checks.seed, "warmup": settings.warmup,
                     "trials": settings.trials, "entry": settings.entry, "allow": list(policy.allow),
                     "allow_torch_ops": policy.allow_torch_ops},
        "runtime": {"device": settings.device, "triton_interpret": not settings.timing_on},
        "samples": [],
        "checks": {},
        "correctness": {},
        "timing": {"measured": False},
        "review_required": False,
        "review_reasons": [],
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "triton": _triton_version()},
    }


def _verdict_table(dtypes: list[str], checks: KernelChecks) -> dict[str, dict[str, Any]]:
    """Per output dtype, the rule that judges it (``oracle``, ``ulps``, ``tolerance``, ``exact``) with
    its numbers; ``rtol``/``atol`` are also the fallback where a sample has no oracle."""
    table = tolerance_table(dtypes, checks.rtol, checks.atol)
    for name, row in table.items():
        dtype = getattr(torch, name)
        factor = oracle_factor(dtype, checks.oracle_factor) if checks.uses_oracle and not row["exact"] else None
        limit = None if row["exact"] else ulp_limit(checks.ulps, dtype)
        row["rule"] = ("exact" if row["exact"] else "oracle" if factor is not None
                       else "ulps" if limit is not None else "tolerance")
        row["oracle_factor"], row["ulps"] = factor, limit
    return table


def _silent(step: str) -> None:
    """The default ``progress``: nothing shown."""


def _triton_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:
        return None


def _run_workers(report: dict[str, Any], capture: Capture, store_repo: Repo, positions: list[int], workdir: Path,
                 source: str, settings: _Settings) -> None:
    info, expected = _run_reference(report, capture, store_repo, positions, workdir, settings)
    if info is None:
        return
    data_dir, problem_data = _candidate_data(workdir, info)
    result, outputs = _run_candidate(report, capture, workdir, source, data_dir, problem_data, settings)
    settings.progress("comparing the candidate's outputs with the recorded and reference outputs")
    _compare_samples(report, capture, info, expected, result, outputs, settings)
    if settings.device == "cpu" and not result.get("load_error"):
        _locate(report, capture, info, workdir, data_dir, settings)
    _runtime_checks(report, result, settings.backend)
    _torch_ops_check(report, result, settings.policy.allow_torch_ops)
    if settings.timing_on:
        _timing(report, info, result)
    else:
        report["timing"] = {"measured": False,
                            "reason": "no CUDA device: correctness only; Triton kernels ran under TRITON_INTERPRET=1 "
                                      "(CPU interpreter), so timing was not measured"}


def _run_reference(report: dict[str, Any], capture: Capture, store_repo: Repo, positions: list[int], workdir: Path,
                   settings: _Settings) -> tuple[dict[str, Any] | None, _Expected]:
    """The reference process: samples, expected outputs and their float64 oracles (``None`` with a
    failure when it fails)."""
    ref_out = workdir / "reference"
    ref_out.mkdir()
    spec_path = workdir / "reference-spec.json"
    spec_path.write_text(json.dumps({
        "repo": store_repo.location, "ref": capture.ref, "trust_source": capture.trust_source,
        "calls": positions, "max_calls": len(positions),
        "random": settings.checks.random_samples, "seed": settings.checks.seed, "device": settings.device,
        "timing": settings.timing_on, "warmup": settings.warmup, "trials": settings.trials, "out_dir": str(ref_out),
        "oracle": settings.checks.uses_oracle}))
    checks = settings.checks
    settings.progress(f"reference process: rebuilding {capture.module_class.rpartition(':')[2]}, running "
                      f"{len(positions)} recorded call(s) and {checks.random_samples} random input(s)"
                      + (" and timing them" if settings.timing_on else ""))
    run = run_isolated([sys.executable, "-m", "modulelens.kernels.worker_reference", str(spec_path)],
                       env=worker_env(settings.device, candidate=False), cwd=Path.cwd(),
                       timeout=settings.policy.reference_seconds, logs=workdir / "reference-logs")
    report["runtime"]["reference_process"] = {k: v for k, v in run.items() if k != "stdout_tail"}
    if run["timed_out"] or run["returncode"] != 0 or not (ref_out / "reference.json").exists():
        why = "timed out" if run["timed_out"] else f"exited with {run['returncode']}"
        fail(report, "reference_failed", f"the reference process {why}: {run['stderr_tail'][-600:].strip()}")
        report["correctness"] = {"passed": False}
        return None, _Expected({}, {})
    info = json.loads((ref_out / "reference.json").read_text())
    expected = _Expected(load_tensors(ref_out / "expected.safetensors"), load_tensors(ref_out / "oracle.safetensors"))
    report["runtime"]["device_name"] = info.get("device_name")
    report["notes"].extend(info.get("notes", []))
    return info, expected


def _candidate_data(workdir: Path, info: dict[str, Any]) -> tuple[Path, Path]:
    """Move what the candidate may see (inputs, weights, sample list: never the expected outputs)
    out of the reference's folder, and write the weights-only folder ``$MODULELENS_PROBLEM_DATA`` names."""
    ref_out = workdir / "reference"
    data_dir = workdir / "candidate-data"
    data_dir.mkdir()
    shutil.move(str(ref_out / "inputs.safetensors"), data_dir / "inputs.safetensors")
    shutil.move(str(ref_out / "weights.safetensors"), data_dir / "weights.safetensors")
    samples = [{k: s[k] for k in ("id", "kind", "state", "training", "args")} | ({"skip": s["skip"]} if s.get("skip") else {})
               for s in info["samples"]]
    (data_dir / "samples.json").write_text(json.dumps({
        "samples": samples, "arg_names": info["arg_names"], "weight_names": info["weight_names"],
        "init_inputs": info["init_inputs"]}))
    shutil.rmtree(ref_out)
    problem_data = workdir / "problem-data"
    problem_data.mkdir()
    first_state = info["samples"][0]["state"] if info["samples"] else 0
    prefix = f"state{first_state}."
    weights = load_tensors(data_dir / "weights.safetensors")
    save_tensors(problem_data / "weights.safetensors", {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
    return data_dir, problem_data


def _run_candidate(report: dict[str, Any], capture: Capture, workdir: Path, source: str, data_dir: Path,
                   problem_data: Path, settings: _Settings) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The candidate process: its result (``candidate.json``) and outputs; failures of the process noted."""
    candidate_dir = workdir / "candidate"
    candidate_dir.mkdir()
    (candidate_dir / "kernel.py").write_text(source)
    cand_out = workdir / "candidate-out"
    cand_out.mkdir()
    run = _candidate_process(capture, workdir, data_dir, problem_data, settings, cand_out, {})
    report["runtime"]["candidate_process"] = dict(run)
    progress = _json_or_none(cand_out / "progress.json") or {}
    result = _json_or_none(cand_out / "candidate.json")
    if run["timed_out"]:
        phase = progress.get("phase", "start")
        where = f"while running {progress['sample']}" if phase == "call" else (
            f"during {phase}" + (f" of {progress['sample']}" if progress.get("sample") else ""))
        fail(report, "timeout", f"the candidate timed out after {settings.policy.timeout:g} s (killed {where})")
    elif result is None:
        fail(report, "process_died", f"the candidate process died (exit {run['returncode']}) during "
                                     f"{progress.get('phase', 'start')}: {run['stderr_tail'][-600:].strip()}")
    outputs = load_tensors(cand_out / "outputs.safetensors") if (cand_out / "outputs.safetensors").exists() else {}
    result = result or {"samples": [], "checks": {}}
    _note_load(report, result)
    return result, outputs


def _candidate_process(capture: Capture, workdir: Path, data_dir: Path, problem_data: Path, settings: _Settings,
                       out_dir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Run the candidate worker on ``workdir/candidate/kernel.py`` (``extra``: more of its spec, such
    as the one sample to trace) and return :func:`run_isolated`'s record of it."""
    candidate_dir = workdir / "candidate"
    blocked = ["modulelens"]
    reference_module = capture.module_class.partition(":")[0]
    if reference_module and not (reference_module == "torch" or reference_module.startswith("torch.")) \
            and reference_module != "__main__":
        blocked.append(reference_module)
    spec_path = workdir / f"{out_dir.name}-spec.json"
    spec_path.write_text(json.dumps({
        "candidate": str(candidate_dir / "kernel.py"), "entry": settings.entry, "data_dir": str(data_dir),
        "device": settings.device, "blocked_modules": blocked, "seed": settings.checks.seed, "warmup": settings.warmup,
        "trials": settings.trials, "timing": settings.timing_on, "out_dir": str(out_dir),
        "repeat": max(settings.warmup, 1), "count_triton_launches": "triton" in settings.backend, **extra}))
    env = worker_env(settings.device, candidate=True)
    env["MODULELENS_PROBLEM_DATA"] = str(problem_data)
    if settings.candidate_home is not None:  # helper modules next to the candidate stay importable
        env["PYTHONPATH"] = os.pathsep.join([str(settings.candidate_home), env["PYTHONPATH"]])
    command = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []),
               str(_CANDIDATE_WORKER), str(spec_path)]
    settings.progress("candidate process: starting")
    return run_isolated(command, env=env, cwd=candidate_dir, timeout=settings.policy.timeout,
                        logs=workdir / f"{out_dir.name}-logs", poll=lambda: settings.progress(_candidate_step(out_dir)))


def _locate(report: dict[str, Any], capture: Capture, info: dict[str, Any], workdir: Path, data_dir: Path,
            settings: _Settings) -> None:
    """On the CPU, after a sample's outputs failed: trace the reference here and the candidate in its
    worker again on that sample, and name the first op where they part (``report["divergence"]``,
    docs/kernels.md). A kernel that launches its own (Triton, CUDA) code shows no aten ops for
    them: its region is then compared at the module boundaries it keeps."""
    failed = next((j for j, entry in enumerate(report["samples"])
                   if entry.get("leaves") and not all(leaf.get("passed") for leaf in entry["leaves"])), None)
    if failed is None:
        return
    sample = info["samples"][failed]
    settings.progress(f"locating the first op where the candidate diverges on {sample['id']}")
    out_dir = workdir / "candidate-trace"
    out_dir.mkdir()
    run = _candidate_process(capture, workdir, data_dir, workdir / "problem-data", settings, out_dir,
                             {"trace_sample": failed, "trace_values": LOCATE_LIMITS.values_bytes})
    written = _json_or_none(out_dir / "trace.json")
    if run["timed_out"] or written is None:
        report["notes"].append(f"locating the first divergence on {sample['id']} failed: the candidate's traced run "
                               + ("timed out" if run["timed_out"] else f"exited with {run['returncode']}"))
        return
    values = load_tensors(out_dir / "trace.safetensors") if (out_dir / "trace.safetensors").exists() else {}
    document = validate_op_trace(written.get("trace"), f"{sample['id']}: the candidate's trace", lambda key: (
        {"dtype": dtype_name(values[key].dtype), "shape": list(values[key].shape)} if key in values else None))
    actual = OpTrace.from_json(dict(document), values.__getitem__)
    expected, stopped = _reference_trace(capture, info, sample, data_dir)
    checks = settings.checks
    divergence = locate(expected, actual, DivergenceRule(rtol=checks.rtol, atol=checks.atol, purpose="kernel"),
                        compared="the kernel candidate against the reference module")
    for side, error in (("reference", stopped), ("candidate", written.get("error") or written.get("trace_error"))):
        if error:
            divergence.notes.append(f"the {side}'s trace stopped early: {error}")
    report["divergence"] = {"sample": sample["id"], **divergence.to_dict()}


def _reference_trace(capture: Capture, info: dict[str, Any], sample: dict[str, Any],
                     data_dir: Path) -> tuple[OpTrace, str | None]:
    """The reference module's trace on a sample's inputs, run as the reference worker runs it."""
    inputs = load_tensors(data_dir / "inputs.safetensors")
    args = [decode_arg(a, inputs) for a in sample["args"]]
    kw_names = list(info.get("kw_names", []))
    split = len(args) - len(kw_names)
    call = capture.calls[sample["position"]]
    module = capture.use_state(sample["state"])
    module.train(sample["training"])
    with call_context(call, torch.device("cpu")), torch.no_grad():
        _, trace, error = trace_call(module, lambda: module(*args[:split], **dict(zip(kw_names, args[split:], strict=True))))
    return trace, error


def _candidate_step(cand_out: Path) -> str:
    """What the candidate process is doing, from the progress file it writes."""
    progress = _json_or_none(cand_out / "progress.json") or {}
    phase = {"call": "running", "timing": "timing"}.get(progress.get("phase", ""), progress.get("phase", "starting"))
    return f"candidate process: {phase}" + (f" {progress['sample']}" if progress.get("sample") else "")


def _note_load(report: dict[str, Any], result: dict[str, Any]) -> None:
    report["candidate"]["entry"] = result.get("entry")
    if result.get("load_error"):
        fail(report, "load", f"the candidate could not be loaded: {result['load_error'].splitlines()[0]}")
        report["candidate"]["load_error"] = result["load_error"]
    weights = result.get("weights")
    if weights:
        report["checks"]["weights"] = weights
        if weights.get("missing") or weights.get("mismatched"):
            report["notes"].append(
                "ModelNew lacks some captured parameters/buffers (missing: "
                f"{weights.get('missing', [])[:5]}, mismatched: {weights.get('mismatched', [])[:3]}); "
                "it must hold the same names and shapes as the reference, or load the weights itself")


def _torch_ops_check(report: dict[str, Any], result: dict[str, Any], allowed: bool) -> None:
    """Fail a candidate whose forward ran heavy ops through PyTorch (unless ``allow_torch_ops``)."""
    used: dict[str, int] = {}
    for record in result.get("samples", []):
        for name, count in (record.get("torch_heavy_ops") or {}).items():
            used[name] = used.get(name, 0) + count
    report["checks"]["torch_heavy_ops"] = used
    if not used:
        return
    ops = ", ".join(f"aten.{name} x{count}" for name, count in sorted(used.items()))
    if allowed:
        report["notes"].append(f"the candidate runs heavy ops through PyTorch ({ops}); accepted (allow_torch_ops)")
    else:
        fail(report, "torch_heavy_ops", f"the candidate's forward ran heavy ops through PyTorch ({ops}), not its own "
                                        "kernels; pass --allow-torch-ops (CandidatePolicy(allow_torch_ops=True)) to "
                                        "accept a mixed candidate")


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _leaves(flat: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[tuple[str, Any]]:
    return [(leaf["path"], tensors[leaf["key"]] if "key" in leaf else leaf.get("value")) for leaf in flat["leaves"]]


@dataclass
class _Expected:
    """What the reference process computed: its outputs and its float64 oracle's, by tensor key."""

    outputs: dict[str, torch.Tensor]
    oracles: dict[str, torch.Tensor]

    def oracle(self, reference: dict[str, Any]) -> dict[str, torch.Tensor] | str:
        """A sample's oracle tensors by output path, or why it has none."""
        flat = reference.get("oracle")
        if flat is None:
            return reference.get("oracle_reason") or "the reference process computed no float64 oracle"
        return {leaf["path"]: self.oracles[leaf["key"]] for leaf in flat["leaves"] if "key" in leaf}


def _compare_leaves(want: list[tuple[str, Any]], got: list[tuple[str, Any]], checks: KernelChecks,
                    oracle: dict[str, torch.Tensor] | str | None = None) -> tuple[list[dict[str, Any]], bool, bool]:
    """Leaf results, whether all pass, and whether all pass with fp32 at 1e-3. ``oracle``: the
    sample's float64 outputs by path (or why there are none) for the oracle rule; ``None`` compares
    by tolerances only (the reference against its recording)."""
    results = []
    all_ok = True
    loose_ok = True
    # None and objects (attention weights not computed, a cache) are not compared: an exported Model
    # returns only the tensor of an (output, None) pair (kernels/export.py)
    want = [(path, w) for path, w in want if _compared(w)]
    got = [(path, g) for path, g in got if _compared(g)]
    if len(want) != len(got):
        results.append({"path": "output", "passed": False, "kind": "structure",
                        "message": f"{len(got)} output value(s), expected {len(want)}"})
        return results, False, False
    for (path, w), (_, g) in zip(want, got, strict=True):
        if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.dtype != g.dtype:
            results.append({"path": path, "passed": False, "kind": "tensor", "dtype": dtype_name(w.dtype),
                            "shape": list(w.shape), "message": f"dtype {dtype_name(g.dtype)} != reference {dtype_name(w.dtype)}"})
            all_ok = loose_ok = False
            continue
        dtype = dtype_name(w.dtype) if isinstance(w, torch.Tensor) else ""
        base = default_tolerance(w.dtype, "kernel") if isinstance(w, torch.Tensor) else None
        r = 0.0 if base is None else (base[0] if checks.rtol is None else checks.rtol)
        a = 0.0 if base is None else (base[1] if checks.atol is None else checks.atol)
        exact = isinstance(w, torch.Tensor) and base is None
        leaf = compare(w, g, exact=exact, rtol=r, atol=a, ulps=checks.ulps,
                       oracle=_oracle_run(oracle, path) if checks.uses_oracle else None,
                       oracle_factor=checks.oracle_factor)[0]
        leaf.path = path
        data = leaf.to_dict()
        if dtype == "float32" and not leaf.passed and leaf.kind == "tensor" and leaf.mismatched:
            loose = compare(w, g, exact=False, rtol=max(LOOSE_FP32, r), atol=max(LOOSE_FP32, a))[0]
            data["passes_at_1e-3"] = loose.passed
            loose_ok = loose_ok and loose.passed
        else:
            data["passes_at_1e-3"] = leaf.passed if dtype == "float32" else None
            loose_ok = loose_ok and leaf.passed
        if oracle is not None:  # the candidate's output (never the reference's) may be degenerate
            data["degenerate"] = degenerate(w, g)
        results.append(data)
        all_ok = all_ok and leaf.passed
    return results, all_ok, loose_ok


def _oracle_run(oracle: dict[str, torch.Tensor] | str | None, path: str) -> OracleRun | None:
    if oracle is None:
        return None
    if isinstance(oracle, str):
        return OracleRun(reason=oracle)
    value = oracle.get(path)
    return OracleRun(outputs=value) if value is not None else OracleRun(reason="the float64 run has no such output")


def _compared(value: Any) -> bool:
    """An output leaf that is compared: a tensor or plain data (not None, not an object or the
    ``{"repr": ...}`` a worker writes for one)."""
    return isinstance(value, (torch.Tensor, bool, int, float, str)) or (
        isinstance(value, (list, dict)) and not (isinstance(value, dict) and "repr" in value))


def _compare_samples(report: dict[str, Any], capture: Capture, info: dict[str, Any], expected: _Expected,
                     result: dict[str, Any], outputs: dict[str, torch.Tensor], settings: _Settings) -> None:
    checks, backend = settings.checks, settings.backend
    ran = {s["id"]: s for s in result.get("samples", [])}
    passed_count = compared = 0
    loose_all = True
    wanted: dict[str, list[tuple[str, Any]]] = {}  # by sample label
    returned: dict[str, list[tuple[str, Any]]] = {}
    for sample in info["samples"]:
        sid = sample["id"]
        label = f"{sid} ({sample['kind']})"
        entry: dict[str, Any] = {"sample": sid, "kind": sample["kind"], "call_index": sample["call_index"],
                                 "randomized": sample.get("randomized", []), "passed": False}
        report["samples"].append(entry)
        reference = sample.get("reference", {})
        if sample.get("skip"):
            entry["passed"] = None
            entry["skipped"] = sample["skip"]
            report["notes"].append(f"{sid} skipped: {sample['skip']}")
            continue
        record = ran.get(sid)
        compared += 1
        if record is None:
            entry["error"] = ("not run: the candidate could not be loaded" if result.get("load_error")
                              else "not run: the candidate process stopped before it")
            continue
        if record.get("error"):
            entry["error"] = record["error"]
            fail(report, "raised", f"{label}: the candidate raised {record['error'].splitlines()[0]}")
            continue
        got = _leaves(record["output"], outputs)
        want = _expected_leaves(report, capture, sample, entry, expected.outputs, checks)
        wanted[label], returned[label] = want, got
        leaves, ok, loose_ok = _compare_leaves(want, got, checks, expected.oracle(reference))
        _describe_sample(entry, record, reference, leaves, loose_ok)
        problems: list[tuple[str, str]] = []
        if not ok:
            bad = next(x for x in leaves if not x["passed"])
            problems.append(("correctness", f"{bad['path']}: {bad.get('message') or 'mismatch'}"))
        problems += [("degenerate_output", f"{leaf['path']}: {leaf['degenerate']}") for leaf in leaves
                     if leaf.get("degenerate")]
        problems += sample_findings(record, reference, backend)
        for check, problem in problems:
            fail(report, check, f"{label}: {problem}")
        entry["passed"] = not problems
        passed_count += entry["passed"]
        loose_all = loose_all and loose_ok
    labels = [{"sample": f"{s['sample']} ({s['kind']})"} for s in report["samples"]]
    for label, problem in cached_outputs(labels, returned, wanted):
        fail(report, "cached_output", f"{label}: {problem}")
        _mark_failed(report, label)
    by_index = {j: returned.get(f"{s['id']} ({s['kind']})") for j, s in enumerate(info["samples"])}
    _refill(report, result, outputs, settings, by_index)
    report["correctness"] = {
        "passed": compared > 0 and passed_count == compared and not _probe_failed(report),
        "samples": compared, "passed_samples": passed_count,
        "recorded_samples": sum(1 for s in info["samples"] if s["kind"] == "recorded"),
        "random_samples": sum(1 for s in info["samples"] if s["kind"] == "random"),
        "skipped_samples": sum(1 for s in info["samples"] if s.get("skip")),
        "fp32_passes_at_1e-3": loose_all if "float32" in report["tolerances"] else None,
    }


def _describe_sample(entry: dict[str, Any], record: dict[str, Any], reference: dict[str, Any],
                     leaves: list[dict[str, Any]], loose_ok: bool) -> None:
    """The sample's entry in the report: its leaves, error sizes and what the worker saw."""
    entry["leaves"] = leaves
    entry["max_abs_error"] = _max_abs(leaves)
    entry["max_rel_error"] = max((float(x.get("max_rel_error", 0) or 0) for x in leaves
                                  if isinstance(x.get("max_rel_error"), (int, float))), default=0.0)
    entry["max_ulps"] = max((float(x["max_ulps"]) for x in leaves if x.get("max_ulps") is not None), default=None)
    entry["passes_at_1e-3"] = loose_ok
    entry["seconds"] = record.get("seconds")
    entry["triton_launches"] = record.get("triton_launches")
    for key in ("mutated_inputs", "mutated_parameters", "output_problems", "output_aliases"):
        entry[key] = record.get(key, [])
    for key in ("same_output_memory_as", "changed_after_return"):
        if record.get(key):
            entry[key] = record[key]
    if record["output"]["spec"] != reference.get("spec", record["output"]["spec"]):
        entry["note"] = f"output container {record['output']['spec']} differs from the reference's {reference.get('spec')}"


def _mark_failed(report: dict[str, Any], label: str) -> None:
    for entry in report["samples"]:
        if f"{entry['sample']} ({entry['kind']})" == label:
            entry["passed"] = False


def _probe_failed(report: dict[str, Any]) -> bool:
    return any(check in report["failed_checks"] for check in ("cached_output", "skipped_work"))


def _refill(report: dict[str, Any], result: dict[str, Any], outputs: dict[str, torch.Tensor], settings: _Settings,
            returned: dict[int, list[tuple[str, Any]] | None]) -> None:
    """The batch-and-skip probe: the output on refilled buffers against the candidate's own output on
    the other sample (fresh buffers, the same values)."""
    refill = result.get("checks", {}).get("refill")

    def gap(index: int, flat: dict[str, Any]) -> float:
        own = returned.get(index)
        return 0.0 if own is None else difference(_leaves(flat, outputs), own)

    for problem in refill_findings(refill, settings.backend, gap, _stable_limit(report, result)):
        fail(report, "skipped_work", f"work skipped on repeated inputs: {problem}")
    if refill:
        report["checks"]["refill"] = {k: v for k, v in refill.items() if k != "output"}


def _expected_leaves(report: dict[str, Any], capture: Capture, sample: dict[str, Any], entry: dict[str, Any],
                     expected: dict[str, torch.Tensor], checks: KernelChecks) -> list[tuple[str, Any]]:
    """What a sample's output is compared with: the recorded output for a recorded call (or the
    reference's run when the reference itself does not reproduce it on this device), the
    reference's run for a random sample."""
    reference = sample.get("reference", {})
    if sample["kind"] != "recorded":
        entry["expected_from"] = "reference run"
        return _leaves(reference, expected)
    want = [("output" + pytree.keystr(kp), leaf) for kp, leaf in
            pytree.tree_flatten_with_path(capture.calls[sample["position"]].output)[0]]
    entry["expected_from"] = "recorded output"
    if "leaves" in reference:
        ref_leaves = _leaves(reference, expected)
        ref_results, ref_ok, _ = _compare_leaves(want, ref_leaves, KernelChecks(rtol=checks.rtol, atol=checks.atol))
        entry["reference_vs_recorded"] = {"passed": ref_ok, "max_abs_error": _max_abs(ref_results)}
        if not ref_ok:
            entry["expected_from"] = "reference run (the reference itself does not reproduce the recorded output here)"
            report["notes"].append(f"{sample['id']}: the reference does not reproduce the recorded output on this "
                                   f"device (max abs error {_max_abs(ref_results):.3g}); compared with the reference run")
            return ref_leaves
    return want


def _max_abs(leaves: list[dict[str, Any]]) -> float:
    values = []
    for leaf in leaves:
        value = leaf.get("max_abs_error", 0.0)
        values.append(float(value) if not isinstance(value, str) else math.inf)
    return max(values, default=0.0)


def _runtime_checks(report: dict[str, Any], result: dict[str, Any], backend: str) -> None:
    checks = result.get("checks", {})
    report["checks"].update({k: v for k, v in checks.items() if k != "refill"})
    for check, line in environment_findings(checks):
        fail(report, check, line)
    limit = max((t["atol"] for t in report["tolerances"].values()), default=0.0)
    determinism = checks.get("determinism")
    if determinism and determinism.get("error"):
        fail(report, "nondeterministic", f"a second run of {determinism['sample']} raised: "
                                         f"{determinism['error'].splitlines()[0]}")
    elif determinism and not determinism.get("identical"):
        if determinism["max_abs_diff"] > limit:
            fail(report, "nondeterministic", f"two runs of {determinism['sample']} differ by "
                                             f"{determinism['max_abs_diff']:.3g} (non-deterministic: uninitialised "
                                             "memory or a race?)")
        else:
            report["notes"].append(f"two runs of {determinism['sample']} differ slightly "
                                   f"({determinism['max_abs_diff']:.3g}, within tolerance)")
    for problem in repeat_findings(checks.get("repeat"), backend, _stable_limit(report, result)):
        fail(report, "warmup_gaming", f"warm-up gaming: {problem}")


def _stable_limit(report: dict[str, Any], result: dict[str, Any]) -> float | None:
    """How far two runs on the same values may differ (the largest fallback ``atol``), or ``None``
    when the candidate's second run of a sample already differs further: it is not deterministic,
    and the probes that compare runs cannot tell exploits from noise."""
    limit = max((t["atol"] for t in report["tolerances"].values()), default=0.0)
    determinism = result.get("checks", {}).get("determinism") or {}
    if determinism.get("error") or determinism.get("max_abs_diff", 0.0) > limit:
        return None
    return limit


def _timing(report: dict[str, Any], info: dict[str, Any], result: dict[str, Any]) -> None:
    """Per sample: reference and candidate p10/median/p90, the speedup of the medians and its range;
    overall: the geometric mean over passing samples, and whether the timings can be trusted (the
    noise rule of tools/timing.py, docs/kernels.md "Timing and noise")."""
    rows = []
    compared: list[tuple[str, Any, dict[str, Any]]] = []
    speedups = []
    ran = {s["id"]: s for s in result.get("samples", [])}
    for sample, entry in zip(info["samples"], report["samples"], strict=True):
        ref_t = sample.get("reference", {}).get("timing")
        cand_t = ran.get(sample["id"], {}).get("timing")
        row: dict[str, Any] = {"sample": sample["id"], "shapes": sample.get("shapes"), "reference": ref_t,
                               "candidate": cand_t, "speedup": None}
        if ref_t and cand_t and "p10_ms" in ref_t and "p10_ms" in cand_t:
            row.update(compare_timings(ref_t, cand_t))
            entry["timing"] = row
            compared.append((sample["id"], sample.get("shapes"), row))
            if entry.get("passed"):
                speedups.append(row["speedup"])
        rows.append(row)
    speedups = [s for s in speedups if math.isfinite(s) and s > 0]
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    spread = timing_stats(speedups, 0) if speedups else {}
    noise = timing_noise(compared)
    report["timing"] = {
        "measured": True, "method": "cuda_event", "l2_flush_bytes": info.get("l2_flush_bytes"),
        "warmup": report["settings"]["warmup"], "trials": report["settings"]["trials"],
        "end_event_after_device_synchronize": True, "samples": rows,
        "speedup_geomean": geomean, "speedup_samples": len(speedups),
        "speedup_p10": spread.get("p10_ms"), "speedup_median": spread.get("median_ms"),
        "speedup_p90": spread.get("p90_ms"),  # of the per-sample speedups (timing_stats names them _ms)
        "trusted": not noise, "noise": noise,
    }
    if noise:
        report["notes"].append("timings too noisy to trust: " + noise[0] + (f" (and {len(noise) - 1} more)" if len(noise) > 1 else ""))
    flagged = [r for r in rows if r["speedup"] is not None and r["speedup"] > SPEEDUP_REVIEW]
    if flagged or (geomean is not None and geomean > SPEEDUP_REVIEW):
        report["review_required"] = True
        report["review_reasons"].append(
            f"speedup above {SPEEDUP_REVIEW:g}x on {len(flagged)} sample(s) (geometric mean "
            f"{geomean if geomean is None else round(geomean, 2)}): check for skipped work before trusting it")


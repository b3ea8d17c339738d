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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import CandidateError, UsageError
from modulelens.format.op_trace import OpTrace
from modulelens.format.tensors import dtype_name, hash_bytes
from modulelens.format.validate_trace import validate_op_trace
from modulelens.kernels.exchange import decode_arg, load_tensors, read_json, save_tensors
from modulelens.kernels.exploits import fail
from modulelens.kernels.judging import Expected, compare_samples, runtime_checks
from modulelens.kernels.options import KERNEL_TIMING, CandidatePolicy, KernelChecks
from modulelens.kernels.problems import select_calls
from modulelens.kernels.process import IsolatedRun, run_isolated, worker_env
from modulelens.kernels.report import ReportData
from modulelens.kernels.static_check import ReferenceInfo, StaticReport, check_source
from modulelens.repo import Repo
from modulelens.restore.compare import tolerance_table, ulp_limit
from modulelens.restore.context import call_context
from modulelens.restore.divergence import LOCATE_LIMITS, DivergenceRule, locate, trace_call
from modulelens.restore.loader import Capture, load
from modulelens.restore.oracle import oracle_factor
from modulelens.tools.timing import TimingConfig, compare_timings, timing_noise, timing_stats

SCHEMA = "modulelens.kernel-verify/1"
SPEEDUP_REVIEW = 10.0
_SOURCE_LIMIT = 256 * 1024
# run by path as a plain script (python -P): importing it here would load its helpers for nothing
_CANDIDATE_WORKER = Path(__file__).absolute().with_name("worker_candidate.py")


@dataclass
class KernelReport:
    """The result of :func:`verify_kernel`; ``data`` is the JSON report (docs/kernels.md)."""

    data: ReportData

    @property
    def passed(self) -> bool:
        """True only for ``status`` ``"PASS"``."""
        return bool(self.data.get("passed"))

    @property
    def status(self) -> str:
        """``"PASS"``, ``"FAIL"`` or ``"UNVERIFIED"`` (nothing failed, but a recorded output had no
        values to compare: ``unverified`` says which)."""
        return str(self.data.get("status") or ("PASS" if self.passed else "FAIL"))

    @property
    def unverified(self) -> list[str]:
        return list(self.data.get("unverified", []))

    @property
    def failures(self) -> list[str]:
        return list(self.data.get("failures", []))

    def to_dict(self) -> ReportData:
        return self.data

    def __str__(self) -> str:
        d = self.data
        lines = [f"kernel verify {d['ref']} {d['candidate']['path']}: {self.status}"]
        lines += [f"  failure: {f}" for f in d.get("failures", [])]
        lines += [f"  cannot verify: {reason}" for reason in self.unverified]
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
    report["status"] = _status(report)
    report["passed"] = report["status"] == "PASS"
    if store:
        say("storing the report")
        path = store_repo.add_report(capture.ref, "kernel", report)
        report["report_path"] = str(path)
    return KernelReport(report)


def _status(report: ReportData) -> str:
    """``FAIL`` on any failure; ``UNVERIFIED`` when nothing failed but some recorded output had no
    values to compare (stored shape-only: ``report["unverified"]`` says which); else ``PASS`` when
    every sample passed."""
    if report["failures"]:
        return "FAIL"
    if report["unverified"]:
        return "UNVERIFIED"
    return "PASS" if report["correctness"].get("passed", False) else "FAIL"


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


def _new_report(capture: Capture, candidate: str | os.PathLike[str], source: str, origin: str, static: StaticReport,
                output_dtypes: list[str], settings: _Settings) -> ReportData:
    checks, policy = settings.checks, settings.policy
    return {
        "schema": SCHEMA,
        "kind": "kernel",
        "ref": capture.ref,
        "module_class": capture.module_class,
        "candidate": {"path": str(Path(candidate).expanduser().absolute()), "origin": origin,
                      "hash": hash_bytes(source.encode()), "entry": None, "backend": static.backend,
                      "source": source if len(source) <= _SOURCE_LIMIT else None},
        "status": "FAIL",
        "passed": False,
        "unverified": [],
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


def _run_workers(report: ReportData, capture: Capture, store_repo: Repo, positions: list[int], workdir: Path,
                 source: str, settings: _Settings) -> None:
    info, expected = _run_reference(report, capture, store_repo, positions, workdir, settings)
    if info is None:
        return
    data_dir, problem_data = _candidate_data(workdir, info)
    result, outputs = _run_candidate(report, capture, workdir, source, data_dir, problem_data, settings)
    settings.progress("comparing the candidate's outputs with the recorded and reference outputs")
    compare_samples(report, capture, info, expected, result, outputs, settings.checks, settings.backend)
    if settings.device == "cpu" and not result.get("load_error"):
        _locate(report, capture, info, workdir, data_dir, settings)
    runtime_checks(report, result, settings.backend)
    _torch_ops_check(report, result, settings.policy.allow_torch_ops)
    if settings.timing_on:
        _timing(report, info, result)
    else:
        report["timing"] = {"measured": False,
                            "reason": "no CUDA device: correctness only; Triton kernels ran under TRITON_INTERPRET=1 "
                                      "(CPU interpreter), so timing was not measured"}


def _run_reference(report: ReportData, capture: Capture, store_repo: Repo, positions: list[int], workdir: Path,
                   settings: _Settings) -> tuple[dict[str, Any] | None, Expected]:
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
        return None, Expected({}, {})
    info = json.loads((ref_out / "reference.json").read_text())
    expected = Expected(load_tensors(ref_out / "expected.safetensors"), load_tensors(ref_out / "oracle.safetensors"))
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


def _run_candidate(report: ReportData, capture: Capture, workdir: Path, source: str, data_dir: Path,
                   problem_data: Path, settings: _Settings) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The candidate process: its result (``candidate.json``) and outputs; failures of the process noted."""
    candidate_dir = workdir / "candidate"
    candidate_dir.mkdir()
    (candidate_dir / "kernel.py").write_text(source)
    cand_out = workdir / "candidate-out"
    cand_out.mkdir()
    run = _candidate_process(capture, workdir, data_dir, problem_data, settings, cand_out, {})
    report["runtime"]["candidate_process"] = dict(run)
    progress = read_json(cand_out / "progress.json") or {}
    result = read_json(cand_out / "candidate.json")
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
                       out_dir: Path, extra: dict[str, object]) -> IsolatedRun:
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


def _locate(report: ReportData, capture: Capture, info: dict[str, Any], workdir: Path, data_dir: Path,
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
    written = read_json(out_dir / "trace.json")
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
    progress = read_json(cand_out / "progress.json") or {}
    phase = {"call": "running", "timing": "timing"}.get(progress.get("phase", ""), progress.get("phase", "starting"))
    return f"candidate process: {phase}" + (f" {progress['sample']}" if progress.get("sample") else "")


def _note_load(report: ReportData, result: dict[str, Any]) -> None:
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


def _torch_ops_check(report: ReportData, result: dict[str, Any], allowed: bool) -> None:
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



def _timing(report: ReportData, info: dict[str, Any], result: dict[str, Any]) -> None:
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
    spread: Mapping[str, object] = timing_stats(speedups, 0) if speedups else {}
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


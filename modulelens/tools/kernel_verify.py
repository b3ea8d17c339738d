"""``modulelens kernel verify``: check a kernel candidate against a captured module (see docs/kernels.md).

A candidate is a Python file defining ``class ModelNew`` (KernelBench style: same constructor and
forward arguments as the reference; the captured weights are loaded into it by name) or
``def kernel_function`` (KernelAgent style: called as ``kernel_function(*forward_args,
*parameters, *buffers)``), or a KernelAgent ``auto_agent`` result JSON with ``kernel_code``.

Verification:

1. a static AST check rejects known reward hacks (:mod:`modulelens.tools.kernel_static_check`);
2. a fresh *reference* process rebuilds the module, runs it on up to 8 recorded calls and on 5
   seeded random inputs of the same shapes and dtypes, and times it on CUDA;
3. a fresh *candidate* process (killed after ``timeout`` seconds) runs the candidate on clones of
   the same inputs; it never holds the reference module or an expected output, and imports of
   modulelens and of the reference's module are blocked there. It checks that inputs are not
   modified, that outputs are plain tensors on the device, that Triton kernels really launch,
   that no threads are left running and no timer is replaced, and that two runs agree;
4. this process compares the outputs: recorded calls against the recorded outputs, random inputs
   against the reference, with tolerances by output dtype; on CUDA it reports CUDA-event timings
   (L2 flushed before each trial) and the speedups.

The report is stored with the capture version (``repo.add_report(ref, "kernel", ...)``), so every
candidate tried on a module is kept as its kernel history.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import ModulelensError
from modulelens.format.tensors import dtype_name, hash_bytes
from modulelens.repo.local import Repo
from modulelens.restore.compare import compare
from modulelens.restore.loader import Capture, load
from modulelens.tools import _kernel_worker as worker
from modulelens.tools.export_kernelbench import MAX_CALLS, select_calls, tolerance_for_dtype, tolerance_table
from modulelens.tools.kernel_static_check import ReferenceInfo, check_source

SCHEMA = "modulelens.kernel-verify/1"
DEFAULT_TIMEOUT = 300.0
REFERENCE_MIN_TIMEOUT = 120.0
RANDOM_SAMPLES = 5
SPEEDUP_REVIEW = 10.0
LOOSE_FP32 = 1e-3
_SOURCE_LIMIT = 256 * 1024


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
        raise ModulelensError(f"candidate {file} does not exist")
    text = file.read_text()
    if file.suffix == ".json":
        try:
            data = json.loads(text[text.index("{"):]) if "{" in text else {}
        except ValueError as error:
            raise ModulelensError(f"{file}: not a KernelAgent result JSON ({error})") from None
        code = data.get("kernel_code") if isinstance(data, dict) else None
        if not code:
            raise ModulelensError(f"{file} has no kernel_code (KernelAgent found no kernel: success="
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


def _worker_env(device: str, candidate: bool) -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    cwd = os.getcwd()
    if cwd not in paths:
        paths.insert(0, cwd)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device.startswith("cuda"):
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
    if candidate:
        env.pop("MODULELENS_REPO", None)
    return env


def _run(command: list[str], *, env: dict[str, str], cwd: Path, timeout: float, logs: Path) -> dict[str, Any]:
    """Run one worker in its own process group; kill the whole group on timeout (and afterwards)."""
    logs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    timed_out = False
    with open(logs / "stdout.txt", "wb") as out, open(logs / "stderr.txt", "wb") as err:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything the candidate left behind
    return {"returncode": code, "timed_out": timed_out, "seconds": round(time.perf_counter() - start, 3),
            "stdout_tail": _tail(logs / "stdout.txt"), "stderr_tail": _tail(logs / "stderr.txt")}


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def verify_kernel(
    ref: str | Capture,
    candidate: str | os.PathLike[str],
    *,
    repo: Repo | str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    reference_timeout: float | None = None,
    device: str | None = None,
    calls: Sequence[int] | None = None,
    max_calls: int = MAX_CALLS,
    random_samples: int = RANDOM_SAMPLES,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    warmup: int = 10,
    trials: int = 100,
    entry: str = "auto",
    allow: Sequence[str] = (),
    store: bool = True,
) -> KernelReport:
    """Verify a kernel candidate file against capture ``ref`` (a ref or a loaded :class:`Capture`)
    and store the report.

    ``timeout`` bounds the candidate's process; ``reference_timeout`` the reference's (default:
    ``max(timeout, 120)``);
    ``rtol``/``atol`` override the per-dtype tolerances; ``allow`` downgrades static-check rules
    to warnings; ``entry`` forces ``"ModelNew"`` or ``"kernel_function"``.

    Example::

        report = verify_kernel("ranker/top_mlp:v3", "kernel.py")
        print(report)                  # PASS/FAIL, failures, speedup
        assert report.passed, report.failures
    """
    if entry not in ("auto", "ModelNew", "kernel_function"):
        raise ModulelensError(f"entry must be auto, ModelNew or kernel_function, not {entry!r}")
    if random_samples < 0 or max_calls < 1 or trials < 1 or warmup < 0 or timeout <= 0:
        raise ModulelensError("random_samples >= 0, max_calls >= 1, trials >= 1, warmup >= 0 and timeout > 0 are required")
    if isinstance(ref, Capture):
        capture, store_repo = ref, ref.repo
    else:
        store_repo = repo if isinstance(repo, Repo) else Repo(repo, create=False)
        capture = load(ref, repo=store_repo)
    source, origin = read_candidate(candidate)
    positions = select_calls(capture, calls, max_calls, same_state=False)
    output_dtypes = _output_dtypes(capture, positions)
    static = check_source(source, ReferenceInfo(capture.module_class, set(output_dtypes)), allow=allow)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    timing_on = device.startswith("cuda")
    tolerances = tolerance_table(output_dtypes or ["float32"], rtol, atol)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "kernel",
        "ref": capture.ref,
        "module_class": capture.module_class,
        "candidate": {"path": str(Path(candidate).expanduser().absolute()), "origin": origin,
                      "hash": hash_bytes(source.encode()), "entry": None, "backend": static.backend,
                      "source": source if len(source) <= _SOURCE_LIMIT else None},
        "passed": False,
        "failures": [],
        "notes": [],
        "static": static.to_dict(),
        "tolerances": tolerances,
        "tolerance_overrides": {"rtol": rtol, "atol": atol},
        "settings": {"device": device, "timeout_s": timeout,
                     "reference_timeout_s": reference_timeout or max(timeout, REFERENCE_MIN_TIMEOUT),
                     "max_calls": max_calls, "random_samples": random_samples,
                     "seed": seed, "warmup": warmup, "trials": trials, "entry": entry, "allow": list(allow)},
        "runtime": {"device": device, "triton_interpret": not timing_on},
        "samples": [],
        "checks": {},
        "correctness": {},
        "timing": {"measured": False},
        "review_required": False,
        "review_reasons": [],
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "triton": _triton_version()},
    }
    failures: list[str] = report["failures"]
    for finding in static.errors:
        failures.append(f"static check: {finding.rule} (line {finding.line}): {finding.message}")
    workdir = Path(tempfile.mkdtemp(prefix="modulelens-kernel-"))
    try:
        _run_workers(report, capture, store_repo, positions, workdir, source, device=device, timeout=timeout,
                     reference_timeout=reference_timeout or max(timeout, REFERENCE_MIN_TIMEOUT),
                     random_samples=random_samples, seed=seed, warmup=warmup, trials=trials, entry=entry,
                     timing_on=timing_on, backend=static.backend,
                     candidate_home=Path(candidate).expanduser().absolute().parent)
    finally:
        if not os.environ.get("MODULELENS_KEEP_KERNEL_WORKDIR"):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            report["notes"].append(f"work directory kept at {workdir}")
    report["passed"] = not failures and report["correctness"].get("passed", False)
    if store:
        path = store_repo.add_report(capture.ref, "kernel", report)
        report["report_path"] = str(path)
    return KernelReport(report)


def _triton_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:
        return None


def _run_workers(report: dict[str, Any], capture: Capture, store_repo: Repo, positions: list[int], workdir: Path,
                 source: str, *, device: str, timeout: float, reference_timeout: float, random_samples: int, seed: int, warmup: int,
                 trials: int, entry: str, timing_on: bool, backend: str, candidate_home: Path | None) -> None:
    failures: list[str] = report["failures"]
    # ---- reference process
    ref_out = workdir / "reference"
    ref_out.mkdir()
    spec_path = workdir / "reference-spec.json"
    spec_path.write_text(json.dumps({
        "repo": str(store_repo.root), "ref": capture.ref, "calls": positions, "max_calls": len(positions),
        "random": random_samples, "seed": seed, "device": device, "timing": timing_on, "warmup": warmup,
        "trials": trials, "out_dir": str(ref_out)}))
    run = _run([sys.executable, "-m", "modulelens.tools._kernel_worker", "reference", str(spec_path)],
               env=_worker_env(device, candidate=False), cwd=Path.cwd(), timeout=reference_timeout,
               logs=workdir / "reference-logs")
    report["runtime"]["reference_process"] = {k: v for k, v in run.items() if k != "stdout_tail"}
    if run["timed_out"] or run["returncode"] != 0 or not (ref_out / "reference.json").exists():
        why = "timed out" if run["timed_out"] else f"exited with {run['returncode']}"
        failures.append(f"the reference process {why}: {run['stderr_tail'][-600:].strip()}")
        report["correctness"] = {"passed": False}
        return
    info = json.loads((ref_out / "reference.json").read_text())
    expected = worker.read_safetensors(ref_out / "expected.safetensors")
    report["runtime"]["device_name"] = info.get("device_name")
    report["notes"].extend(info.get("notes", []))
    # ---- candidate inputs: everything except the reference outputs
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
    problem_data = workdir / "problem-data"  # what $MODULELENS_PROBLEM_DATA points at: the weights only
    problem_data.mkdir()
    first_state = info["samples"][0]["state"] if info["samples"] else 0
    weights = worker.read_safetensors(data_dir / "weights.safetensors")
    prefix = f"state{first_state}."
    worker.write_safetensors(problem_data / "weights.safetensors",
                             {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
    del weights
    candidate_dir = workdir / "candidate"
    candidate_dir.mkdir()
    (candidate_dir / "kernel.py").write_text(source)
    cand_out = workdir / "candidate-out"
    cand_out.mkdir()
    blocked = ["modulelens"]
    reference_module = capture.module_class.partition(":")[0]
    if reference_module and not (reference_module == "torch" or reference_module.startswith("torch.")) \
            and reference_module != "__main__":
        blocked.append(reference_module)
    spec_path = workdir / "candidate-spec.json"
    spec_path.write_text(json.dumps({
        "candidate": str(candidate_dir / "kernel.py"), "entry": entry, "data_dir": str(data_dir),
        "device": device, "blocked_modules": blocked, "seed": seed, "warmup": warmup, "trials": trials,
        "timing": timing_on, "out_dir": str(cand_out), "count_triton_launches": "triton" in backend}))
    env = _worker_env(device, candidate=True)
    env["MODULELENS_PROBLEM_DATA"] = str(problem_data)
    if candidate_home is not None:  # helper modules next to the candidate stay importable
        env["PYTHONPATH"] = os.pathsep.join([str(candidate_home), env["PYTHONPATH"]])
    command = [sys.executable]
    if sys.version_info >= (3, 11):
        command.append("-P")
    command += [str(Path(worker.__file__).absolute()), "candidate", str(spec_path)]
    run = _run(command, env=env, cwd=candidate_dir, timeout=timeout, logs=workdir / "candidate-logs")
    report["runtime"]["candidate_process"] = {k: v for k, v in run.items()}
    progress = _json_or_none(cand_out / "progress.json") or {}
    result = _json_or_none(cand_out / "candidate.json")
    if run["timed_out"]:
        phase = progress.get("phase", "start")
        where = f"while running {progress['sample']}" if phase == "call" else (
            f"during {phase}" + (f" of {progress['sample']}" if progress.get("sample") else ""))
        failures.append(f"the candidate timed out after {timeout:g} s (killed {where})")
    elif result is None:
        failures.append(f"the candidate process died (exit {run['returncode']}) during {progress.get('phase', 'start')}: "
                        f"{run['stderr_tail'][-600:].strip()}")
    outputs = worker.read_safetensors(cand_out / "outputs.safetensors") if (cand_out / "outputs.safetensors").exists() else {}
    result = result or {"samples": [], "checks": {}}
    report["candidate"]["entry"] = result.get("entry")
    if result.get("load_error"):
        failures.append(f"the candidate could not be loaded: {result['load_error'].splitlines()[0]}")
        report["candidate"]["load_error"] = result["load_error"]
    if result.get("weights"):
        report["checks"]["weights"] = result["weights"]
        if result["weights"].get("missing") or result["weights"].get("mismatched"):
            report["notes"].append(
                "ModelNew lacks some captured parameters/buffers (missing: "
                f"{result['weights'].get('missing', [])[:5]}, mismatched: {result['weights'].get('mismatched', [])[:3]}); "
                "it must hold the same names and shapes as the reference, or load the weights itself")
    _compare_samples(report, capture, info, expected, result, outputs, backend)
    _runtime_checks(report, result)
    if timing_on:
        _timing(report, info, result)
    else:
        report["timing"] = {"measured": False,
                            "reason": "no CUDA device: correctness only; Triton kernels ran under TRITON_INTERPRET=1 "
                                      "(CPU interpreter), so timing was not measured"}


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _leaves(flat: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[tuple[str, Any]]:
    return [(leaf["path"], tensors[leaf["key"]] if "key" in leaf else leaf.get("value")) for leaf in flat["leaves"]]


def _compare_leaves(want: list[tuple[str, Any]], got: list[tuple[str, Any]], rtol: float | None,
                    atol: float | None) -> tuple[list[dict[str, Any]], bool, bool]:
    """Leaf results, whether all pass, and whether all pass with fp32 at 1e-3."""
    results = []
    all_ok = True
    loose_ok = True
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
        r, a = tolerance_for_dtype(dtype, rtol, atol)
        exact = isinstance(w, torch.Tensor) and dtype not in ("float32", "float64", "float16", "bfloat16", "complex64",
                                                              "complex128") and not w.dtype.is_floating_point
        leaf = compare(w, g, exact=exact, rtol=r, atol=a)[0]
        leaf.path = path
        data = leaf.to_dict()
        if dtype == "float32" and not leaf.passed and leaf.kind == "tensor" and leaf.mismatched:
            loose = compare(w, g, exact=False, rtol=max(LOOSE_FP32, r), atol=max(LOOSE_FP32, a))[0]
            data["passes_at_1e-3"] = loose.passed
            loose_ok = loose_ok and loose.passed
        else:
            data["passes_at_1e-3"] = leaf.passed if dtype == "float32" else None
            loose_ok = loose_ok and leaf.passed
        results.append(data)
        all_ok = all_ok and leaf.passed
    return results, all_ok, loose_ok


def _compare_samples(report: dict[str, Any], capture: Capture, info: dict[str, Any], expected: dict[str, torch.Tensor],
                     result: dict[str, Any], outputs: dict[str, torch.Tensor], backend: str) -> None:
    failures: list[str] = report["failures"]
    rtol, atol = report["tolerance_overrides"]["rtol"], report["tolerance_overrides"]["atol"]
    ran = {s["id"]: s for s in result.get("samples", [])}
    passed_count = compared = 0
    loose_all = True
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
        if record is None:
            entry["error"] = ("not run: the candidate could not be loaded" if result.get("load_error")
                              else "not run: the candidate process stopped before it")
            compared += 1
            continue
        compared += 1
        if record.get("error"):
            entry["error"] = record["error"]
            failures.append(f"{label}: the candidate raised {record['error'].splitlines()[0]}")
            continue
        got = _leaves(record["output"], outputs)
        if sample["kind"] == "recorded":
            want = [("output" + pytree.keystr(kp), leaf) for kp, leaf in
                    pytree.tree_flatten_with_path(capture.calls[sample["position"]].output)[0]]
            entry["expected_from"] = "recorded output"
            if "leaves" in reference:
                ref_leaves = _leaves(reference, expected)
                ref_results, ref_ok, _ = _compare_leaves(want, ref_leaves, rtol, atol)
                entry["reference_vs_recorded"] = {"passed": ref_ok, "max_abs_error": _max_abs(ref_results)}
                if not ref_ok:
                    want = ref_leaves
                    entry["expected_from"] = "reference run (the reference itself does not reproduce the recorded output here)"
                    report["notes"].append(f"{sid}: the reference does not reproduce the recorded output on this device "
                                           f"(max abs error {_max_abs(ref_results):.3g}); compared with the reference run")
        else:
            want = _leaves(reference, expected)
            entry["expected_from"] = "reference run"
        leaves, ok, loose_ok = _compare_leaves(want, got, rtol, atol)
        entry["leaves"] = leaves
        entry["max_abs_error"] = _max_abs(leaves)
        entry["max_rel_error"] = max((float(x.get("max_rel_error", 0) or 0) for x in leaves
                                      if isinstance(x.get("max_rel_error"), (int, float))), default=0.0)
        entry["passes_at_1e-3"] = loose_ok
        entry["seconds"] = record.get("seconds")
        entry["triton_launches"] = record.get("triton_launches")
        entry["mutated_inputs"] = record.get("mutated_inputs", [])
        entry["output_problems"] = record.get("output_problems", [])
        if record["output"]["spec"] != reference.get("spec", record["output"]["spec"]):
            entry["note"] = f"output container {record['output']['spec']} differs from the reference's {reference.get('spec')}"
        problems = []
        if not ok:
            bad = next(x for x in leaves if not x["passed"])
            problems.append(f"{bad['path']}: {bad.get('message') or 'mismatch'}")
        if entry["mutated_inputs"]:
            problems.append(f"modified its input(s) in place: {', '.join(entry['mutated_inputs'])}")
        problems.extend(entry["output_problems"])
        if "triton" in backend and record.get("triton_launches") == 0:
            problems.append("no Triton kernel was launched (the result came from somewhere else)")
        for problem in problems:
            failures.append(f"{label}: {problem}")
        entry["passed"] = not problems
        passed_count += entry["passed"]
        loose_all = loose_all and loose_ok
    report["correctness"] = {
        "passed": compared > 0 and passed_count == compared,
        "samples": compared, "passed_samples": passed_count,
        "recorded_samples": sum(1 for s in info["samples"] if s["kind"] == "recorded"),
        "random_samples": sum(1 for s in info["samples"] if s["kind"] == "random"),
        "skipped_samples": sum(1 for s in info["samples"] if s.get("skip")),
        "fp32_passes_at_1e-3": loose_all if "float32" in report["tolerances"] else None,
    }


def _max_abs(leaves: list[dict[str, Any]]) -> float:
    values = []
    for leaf in leaves:
        value = leaf.get("max_abs_error", 0.0)
        values.append(float(value) if not isinstance(value, str) else math.inf)
    return max(values, default=0.0)


def _runtime_checks(report: dict[str, Any], result: dict[str, Any]) -> None:
    failures: list[str] = report["failures"]
    checks = result.get("checks", {})
    report["checks"].update({k: v for k, v in checks.items()})
    if checks.get("timers_patched"):
        where, names = next(iter(checks["timers_patched"].items()))
        failures.append(f"the candidate replaced timing functions ({', '.join(names)}) during {where}")
    if checks.get("threads_left_running"):
        where, names = next(iter(checks["threads_left_running"].items()))
        failures.append(f"the candidate left threads running after {where}: {', '.join(names)}")
    determinism = checks.get("determinism")
    if determinism and determinism.get("error"):
        failures.append(f"a second run of {determinism['sample']} raised: {determinism['error'].splitlines()[0]}")
    elif determinism and not determinism.get("identical"):
        limit = max((t["atol"] for t in report["tolerances"].values()), default=0.0)
        if determinism["max_abs_diff"] > limit:
            failures.append(f"two runs of {determinism['sample']} differ by {determinism['max_abs_diff']:.3g} "
                            "(non-deterministic: uninitialised memory or a race?)")
        else:
            report["notes"].append(f"two runs of {determinism['sample']} differ slightly "
                                   f"({determinism['max_abs_diff']:.3g}, within tolerance)")


def _timing(report: dict[str, Any], info: dict[str, Any], result: dict[str, Any]) -> None:
    rows = []
    speedups = []
    ran = {s["id"]: s for s in result.get("samples", [])}
    for sample, entry in zip(info["samples"], report["samples"], strict=True):
        ref_t = sample.get("reference", {}).get("timing")
        cand_t = ran.get(sample["id"], {}).get("timing")
        row = {"sample": sample["id"], "reference": ref_t, "candidate": cand_t, "speedup": None}
        if ref_t and cand_t and cand_t["mean_ms"] > 0:
            row["speedup"] = ref_t["mean_ms"] / cand_t["mean_ms"]
            row["speedup_median"] = ref_t["median_ms"] / cand_t["median_ms"] if cand_t["median_ms"] > 0 else None
            entry["timing"] = row
            if entry.get("passed"):
                speedups.append(row["speedup"])
        rows.append(row)
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    report["timing"] = {
        "measured": True, "method": "cuda_event", "l2_flush_bytes": info.get("l2_flush_bytes"),
        "warmup": report["settings"]["warmup"], "trials": report["settings"]["trials"],
        "end_event_after_device_synchronize": True, "samples": rows,
        "speedup_geomean": geomean, "speedup_samples": len(speedups),
    }
    flagged = [r for r in rows if r["speedup"] is not None and r["speedup"] > SPEEDUP_REVIEW]
    if flagged or (geomean is not None and geomean > SPEEDUP_REVIEW):
        report["review_required"] = True
        report["review_reasons"].append(
            f"speedup above {SPEEDUP_REVIEW:g}x on {len(flagged)} sample(s) (geometric mean "
            f"{geomean if geomean is None else round(geomean, 2)}): check for skipped work before trusting it")

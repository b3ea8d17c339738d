"""How ``kernel verify`` judges a candidate's outputs (modulelens/kernels/verify.py runs the processes).

Each sample's output leaves are compared with what was expected of them: a recorded call's
recorded output (or the reference run's, where the reference itself does not reproduce the
recording on this device), a random sample's reference run; floating leaves in ULPs against the
reference's float64 oracle, or by per-dtype tolerances. The candidate worker's probes (cached
outputs, skipped work on refilled buffers, a second run, warm-up gaming, its environment) become
named failures (:mod:`modulelens.kernels.exploits`), and a sample with nothing real to compare is
UNVERIFIED, never PASS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.format.shape_only import ShapeOnly
from modulelens.format.tensors import dtype_name
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
from modulelens.kernels.options import KernelChecks
from modulelens.restore.compare import compare, default_tolerance, nothing_to_compare
from modulelens.restore.loader import Capture
from modulelens.restore.oracle import OracleRun

# fp32 outputs are also judged at this looser tolerance, as KernelBench does (``passes_at_1e-3``)
LOOSE_FP32 = 1e-3


def _leaves(flat: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[tuple[str, object]]:
    return [(leaf["path"], tensors[leaf["key"]] if "key" in leaf else leaf.get("value")) for leaf in flat["leaves"]]


@dataclass
class Expected:
    """What the reference process computed: its outputs and its float64 oracle's, by tensor key."""

    outputs: dict[str, torch.Tensor]
    oracles: dict[str, torch.Tensor]

    def oracle(self, reference: dict[str, Any]) -> dict[str, torch.Tensor] | str:
        """A sample's oracle tensors by output path, or why it has none."""
        flat = reference.get("oracle")
        if flat is None:
            return reference.get("oracle_reason") or "the reference process computed no float64 oracle"
        return {leaf["path"]: self.oracles[leaf["key"]] for leaf in flat["leaves"] if "key" in leaf}


def _compare_leaves(want: list[tuple[str, object]], got: list[tuple[str, object]], checks: KernelChecks,
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
        tensor_like = isinstance(w, (torch.Tensor, ShapeOnly))
        if isinstance(w, (torch.Tensor, ShapeOnly)) and isinstance(g, torch.Tensor) and w.dtype != g.dtype:
            results.append({"path": path, "passed": False, "kind": "tensor", "dtype": dtype_name(w.dtype),
                            "shape": list(w.shape), "message": f"dtype {dtype_name(g.dtype)} != reference {dtype_name(w.dtype)}"})
            all_ok = loose_ok = False
            continue
        dtype = dtype_name(w.dtype) if isinstance(w, (torch.Tensor, ShapeOnly)) else ""
        base = default_tolerance(w.dtype, "kernel") if isinstance(w, (torch.Tensor, ShapeOnly)) else None
        r = 0.0 if base is None else (base[0] if checks.rtol is None else checks.rtol)
        a = 0.0 if base is None else (base[1] if checks.atol is None else checks.atol)
        exact = tensor_like and base is None
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


def _compared(value: object) -> bool:
    """An output leaf that is compared: a tensor (or a recorded one stored shape-only) or plain data
    (not None, not an object or the ``{"repr": ...}`` a worker writes for one)."""
    return isinstance(value, (torch.Tensor, ShapeOnly, bool, int, float, str)) or (
        isinstance(value, (list, dict)) and not (isinstance(value, dict) and "repr" in value))


def compare_samples(report: dict[str, Any], capture: Capture, info: dict[str, Any], expected: Expected,
                    result: dict[str, Any], outputs: dict[str, torch.Tensor], checks: KernelChecks, backend: str) -> None:
    """Each sample's outputs against what was expected of it (the recorded output, or the reference
    run's), the cached-output and skipped-work probes, and the report's correctness summary."""
    ran = {s["id"]: s for s in result.get("samples", [])}
    passed_count = compared = unverified_count = 0
    loose_all = True
    wanted: dict[str, list[tuple[str, object]]] = {}  # by sample label
    returned: dict[str, list[tuple[str, object]]] = {}
    for sample in info["samples"]:
        sid = sample["id"]
        label = f"{sid} ({sample['kind']})"
        entry: dict[str, Any] = {"sample": sid, "kind": sample["kind"], "call_index": sample["call_index"],
                                 "randomized": sample.get("randomized", []), "status": "fail", "passed": False}
        report["samples"].append(entry)
        reference = sample.get("reference", {})
        if sample.get("skip"):
            entry["passed"], entry["status"] = None, "skipped"
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
        # a leaf with no recorded values (stored shape-only) can contradict the recording, never prove it
        entry["unverified"] = [f"{leaf['path']}: {leaf.get('message')}" for leaf in leaves
                               if leaf["passed"] and leaf.get("compared") is False]
        if not problems and not entry["unverified"] and entry.get("expected_from") == "recorded output":
            # NaN matches NaN and None matches None: a recording with nothing else proves nothing
            nothing = nothing_to_compare([value for _, value in want])
            entry["unverified"] = [nothing] if nothing else []
        entry["status"] = "fail" if problems else "unverified" if entry["unverified"] else "pass"
        entry["passed"] = entry["status"] == "pass"
        passed_count += entry["passed"]
        unverified_count += entry["status"] == "unverified"
        report["unverified"] += [f"{label}: {reason}" for reason in entry["unverified"]]
        loose_all = loose_all and loose_ok
    labels = [{"sample": f"{s['sample']} ({s['kind']})"} for s in report["samples"]]
    for label, problem in cached_outputs(labels, returned, wanted):
        fail(report, "cached_output", f"{label}: {problem}")
        _mark_failed(report, label)
    by_index = {j: returned.get(f"{s['id']} ({s['kind']})") for j, s in enumerate(info["samples"])}
    _refill(report, result, outputs, backend, by_index)
    report["correctness"] = {
        "passed": compared > 0 and passed_count == compared and not _probe_failed(report),
        "samples": compared, "passed_samples": passed_count, "unverified_samples": unverified_count,
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
            entry["passed"], entry["status"] = False, "fail"


def _probe_failed(report: dict[str, Any]) -> bool:
    return any(check in report["failed_checks"] for check in ("cached_output", "skipped_work"))


def _refill(report: dict[str, Any], result: dict[str, Any], outputs: dict[str, torch.Tensor], backend: str,
            returned: dict[int, list[tuple[str, object]] | None]) -> None:
    """The batch-and-skip probe: the output on refilled buffers against the candidate's own output on
    the other sample (fresh buffers, the same values)."""
    refill = result.get("checks", {}).get("refill")

    def gap(index: int, flat: dict[str, Any]) -> float:
        own = returned.get(index)
        return 0.0 if own is None else difference(_leaves(flat, outputs), own)

    for problem in refill_findings(refill, backend, gap, _stable_limit(report, result)):
        fail(report, "skipped_work", f"work skipped on repeated inputs: {problem}")
    if refill:
        report["checks"]["refill"] = {k: v for k, v in refill.items() if k != "output"}


def _expected_leaves(report: dict[str, Any], capture: Capture, sample: dict[str, Any], entry: dict[str, Any],
                     expected: dict[str, torch.Tensor], checks: KernelChecks) -> list[tuple[str, object]]:
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


def runtime_checks(report: dict[str, Any], result: dict[str, Any], backend: str) -> None:
    """What the candidate worker saw besides outputs (its environment, a second run, repeated
    inputs) turned into named failures and notes."""
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

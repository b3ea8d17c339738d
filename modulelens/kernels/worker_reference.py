"""Reference process of ``modulelens kernel verify`` (internal; ``python -m modulelens.kernels.worker_reference SPEC``).

Loads the capture, builds the samples (recorded calls plus seeded random inputs of the same shapes
and dtypes, drawn by :func:`modulelens.restore.synthesize.random_like`), runs the restored
reference module on them (timing it on CUDA) and a float64 copy of it (the oracle of the ULP
verdicts, :mod:`modulelens.restore.oracle`), and writes the inputs, the weights, the reference
outputs and the oracle's for :mod:`modulelens.kernels.verify`, which hands the inputs and weights
(never an output) to the candidate process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.kernels.exchange import (
    aliased_inputs,
    encode_arg,
    error_text,
    flatten_output,
    same_bits,
    save_tensors,
    to_device,
    write_json,
)
from modulelens.kernels.problems import CallBinding, bind_calls, select_calls
from modulelens.restore.loader import Capture, load
from modulelens.restore.oracle import Float64Oracle
from modulelens.restore.replay import call_context
from modulelens.restore.synthesize import random_like
from modulelens.tools.timing import CudaTimer


def _randomize(value: object, generator: torch.Generator, path: str, notes: list[dict[str, str]]) -> object:
    """Random values like a recorded argument (tensors inside lists/tuples/dicts too); others kept."""
    if isinstance(value, torch.Tensor):
        tensor, how = random_like(value, generator)
        notes.append({"arg": path, "how": how})
        return tensor
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_randomize(v, generator, f"{path}[{i}]", notes) for i, v in enumerate(value))
    if type(value) is dict:
        return {k: _randomize(v, generator, f"{path}[{k!r}]", notes) for k, v in value.items()}
    return value


def run_reference(spec: dict[str, Any]) -> int:
    """Reference mode: samples, reference outputs and reference timing (files in ``spec["out_dir"]``)."""
    out_dir = Path(spec["out_dir"])
    device = torch.device(spec["device"])
    capture = load(spec["ref"], repo=spec["repo"], device=device, trust_source=spec.get("trust_source"))
    positions = select_calls(capture, spec.get("calls"), spec["max_calls"], same_state=False)
    binding = bind_calls(capture, positions)
    timer = CudaTimer(device) if spec.get("timing") and device.type == "cuda" else None
    inputs: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    oracles: dict[str, torch.Tensor] = {}
    samples: list[dict[str, Any]] = []
    float64: dict[int, Float64Oracle] = {}  # per recorded state, made when a sample of it first needs one
    for j, (sample_id, kind, position, args, notes) in enumerate(_plan(capture, binding, positions, spec)):
        call = capture.calls[position]
        prefix = f"s{j}"
        entry: dict[str, Any] = {"id": sample_id, "kind": kind, "position": position, "call_index": call.index,
                                 "state": call.state_index, "training": call.training,
                                 "args": [encode_arg(a, f"{prefix}.a{i}", inputs) for i, a in enumerate(args)],
                                 "shapes": shape_key(args),
                                 "randomized": notes, "reference": {}}
        samples.append(entry)
        _run_sample(capture, binding, entry, args, prefix, expected, device, timer, spec)
        if spec.get("oracle", True) and "leaves" in entry["reference"]:
            _run_oracle(capture, binding, entry, args, prefix, oracles, float64, device)
    weights: dict[str, torch.Tensor] = {}
    states = sorted({s["state"] for s in samples})
    for index in states:
        for name, tensor in _state_tensors(capture, index).items():
            weights[f"state{index}.{name}"] = tensor
    save_tensors(out_dir / "inputs.safetensors", inputs)
    save_tensors(out_dir / "weights.safetensors", weights)
    save_tensors(out_dir / "expected.safetensors", expected)
    save_tensors(out_dir / "oracle.safetensors", oracles)
    write_json(out_dir / "reference.json", {
        "ref": capture.ref, "device": str(device), "samples": samples, "states": states,
        "weight_names": binding.weight_names, "arg_names": binding.names, "kw_names": binding.kw_names,
        "init_inputs": binding.init_inputs, "notes": capture.notes + binding.notes,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "l2_flush_bytes": timer.flush_bytes if timer else None,
    })
    return 0


def _plan(capture: Capture, binding: CallBinding, positions: list[int],
          spec: dict[str, Any]) -> list[tuple[str, str, int, Sequence[object], list[dict[str, str]]]]:
    """``(sample id, kind, call position, positional args, randomization notes)`` of every sample:
    the recorded calls, then ``spec["random"]`` seeded random variants of them in turn."""
    plan: list[tuple[str, str, int, Sequence[object], list[dict[str, str]]]] = []
    for position in positions:
        plan.append((f"call {capture.calls[position].index}", "recorded", position, binding.positional[position], []))
    for j in range(spec["random"]):
        position = positions[j % len(positions)]
        generator = torch.Generator().manual_seed(int(spec["seed"]) * 1000 + j)
        notes: list[dict[str, str]] = []
        args = [_randomize(value, generator, name, notes)
                for value, name in zip(binding.positional[position], binding.names, strict=True)]
        plan.append((f"random {j}", "random", position, args, notes))
    return plan


def _run_sample(capture: Capture, binding: CallBinding, entry: dict[str, Any], args: Sequence[object], prefix: str,
                expected: dict[str, torch.Tensor], device: torch.device, timer: CudaTimer | None,
                spec: dict[str, Any]) -> None:
    """Run the reference on one sample: its outputs into ``expected``; a random sample on which the
    reference raises or is not deterministic is marked skipped."""
    call = capture.calls[entry["position"]]
    module = capture.use_state(call.state_index)  # reloads too when a call changed a buffer in place
    module.train(call.training)
    kind = entry["kind"]

    def run_once() -> tuple[object, list[object]]:
        """The output, and the arguments it was computed from."""
        positional = to_device(list(args), device)
        n = len(positional) - len(binding.kw_names)
        with call_context(call, device), torch.no_grad():
            out = module(*positional[:n], **dict(zip(binding.kw_names, positional[n:], strict=True)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out, positional

    try:
        output, passed = run_once()
        entry["reference"] = flatten_output(output, prefix, expected)
        # an output sharing memory with an input is the module's own doing (a view): a candidate may too
        entry["reference"]["aliases"] = aliased_inputs(output, list(zip(binding.names, passed, strict=False)))
        del output, passed
        if kind == "random":
            scratch: dict[str, torch.Tensor] = {}
            again = flatten_output(run_once()[0], prefix + "again", scratch)
            deterministic = all(
                same_bits(expected[a["key"]], scratch[b["key"]]) if "key" in a and "key" in b
                else a.get("value") == b.get("value")
                for a, b in zip(entry["reference"]["leaves"], again["leaves"], strict=False))
            entry["reference"]["deterministic"] = deterministic
            if not deterministic:
                entry["skip"] = "the reference module is not deterministic on this input"
        if timer is not None:
            positional = to_device(list(args), device)
            n = len(positional) - len(binding.kw_names)
            kwargs = dict(zip(binding.kw_names, positional[n:], strict=True))
            with torch.no_grad():
                entry["reference"]["timing"] = timer.time(lambda: module(*positional[:n], **kwargs),
                                                          spec["warmup"], spec["trials"])
    except Exception as error:  # the reference failing on a random input is reported, not fatal
        entry["reference"]["error"] = error_text(error)
        if kind == "random":
            entry["skip"] = "the reference module raised on this input"


def _run_oracle(capture: Capture, binding: CallBinding, entry: dict[str, Any], args: Sequence[object], prefix: str,
                oracles: dict[str, torch.Tensor], float64: dict[int, Float64Oracle], device: torch.device) -> None:
    """The float64 oracle of one sample (``entry["reference"]["oracle"]``, its tensors into
    ``oracles``), or why there is none (``oracle_reason``)."""
    call = capture.calls[entry["position"]]
    if call.state_index not in float64:
        float64[call.state_index] = Float64Oracle(capture.use_state(call.state_index))
    positional = to_device(list(args), device)
    n = len(positional) - len(binding.kw_names)
    run = float64[call.state_index].run(positional[:n], dict(zip(binding.kw_names, positional[n:], strict=True)),
                                        context=lambda: call_context(call, device), training=call.training)
    if run.outputs is None:
        entry["reference"]["oracle_reason"] = run.reason
    else:
        entry["reference"]["oracle"] = flatten_output(run.outputs, prefix + "oracle", oracles)


def shape_key(args: Sequence[object]) -> str:
    """The dtypes and shapes of a sample's tensors (and its other values): samples with equal keys do
    the same work, so their timings must agree (the noise rule, tools/timing.py)."""
    parts = []
    for leaf in pytree.tree_leaves(args):
        if isinstance(leaf, torch.Tensor):
            parts.append(f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}")
        else:
            parts.append(repr(leaf)[:40])
    return ", ".join(parts)


def _state_tensors(capture: Capture, index: int) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (persistent or not) of one recorded state, by name."""
    states = capture.metadata.get("states", [])
    if not states:
        return {}
    state = states[index]
    result = {n: capture.tensor(e["tensor"]) for n, e in state["parameters"].items()}
    result.update({n: capture.tensor(e["tensor"]) for n, e in state["buffers"].items()})
    return result


def main(argv: list[str]) -> int:
    """``worker_reference SPEC.json``; the spec file is deleted once read."""
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    spec_path.unlink()
    return run_reference(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

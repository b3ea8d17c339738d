"""The op trace (modulelens/format/op_trace.py): what the recorder sees of a real call, its JSON form,
and the checks a stored trace passes before anything reads it (format/validate_trace.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from diverge_models import TinyGPT, tokens

from modulelens.errors import CorruptCaptureError
from modulelens.format import spec
from modulelens.format.op_trace import TRACE_FORMAT, TRACE_VERSION, OpRecorder, OpTrace, TraceLimits
from modulelens.format.shape_only import tensor_stats
from modulelens.format.validate_trace import validate_op_trace

MODELS = str(Path(__file__).resolve().parents[1] / "support" / "diverge_models.py")


def _trace(module: torch.nn.Module, run: Any, limits: TraceLimits = TraceLimits(), stats: Any = tensor_stats
           ) -> tuple[Any, OpTrace, OpRecorder]:
    recorder = OpRecorder(module, stats=stats, limits=limits)
    recorder.start()
    output = None
    try:
        output = run()
    finally:
        trace = recorder.stop(output)
    return output, trace, recorder


def test_a_real_call_gives_its_ops_in_their_submodules_with_source_lines() -> None:
    torch.manual_seed(0)
    model = TinyGPT(depth=2).eval()
    x = tokens()
    expected = model(x)
    output, trace, recorder = _trace(model, lambda: model(x))
    assert recorder.error is None and torch.equal(output, expected)  # the traced call computes the same
    paths = [call.path for call in trace.modules]
    assert paths[0] == "" and "blocks.1.attn.qkv" in paths and paths.index("blocks.0") < paths.index("blocks.1")
    softmax = next(op for op in trace.ops if op.op == "aten::_softmax")
    assert trace.modules[softmax.module].path == "blocks.0.attn"
    source = trace.source_of(softmax)
    assert source is not None and source.startswith(MODELS + ":") and source.endswith("in forward")
    assert "weights = torch.softmax(scores, dim=-1)" in Path(MODELS).read_text().splitlines()[
        int(source.split(":")[1].split()[0]) - 1]
    linear = next(op for op in trace.ops if trace.modules[op.module].path == "blocks.0.attn.qkv" and op.op == "aten::addmm")
    assert linear.inputs[0] == ["float32", [96]]  # the bias, then the flattened input and the weight
    # each module call's ops lie inside its parent's, and its output is that of its last op
    for call in trace.modules[1:]:
        parent = trace.modules[call.parent]
        assert parent.start <= call.start <= call.end <= parent.end
    assert trace.modules[0].outputs[0].fingerprint == trace.ops[-1].outputs[0].fingerprint


def test_fingerprints_are_exact_and_statistics_are_the_one_statistics_function() -> None:
    module = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    output, trace, _ = _trace(module, lambda: module(x))
    value = trace.ops[-1].outputs[0]
    raw = output.detach().contiguous().view(torch.uint8).numpy().tobytes()
    assert value.fingerprint == "xxh3_128:" + xxhash.xxh3_128_hexdigest(raw)
    assert value.stats == tensor_stats(output.detach(), quantiles=False)
    assert torch.equal(value.tensor, output) and value.tensor is not output  # a copy, kept under the budget
    # a one-ULP change changes the fingerprint; -0.0 against 0.0 too
    nudged = output.detach().clone()
    nudged.view(-1)[0] = torch.nextafter(nudged.view(-1)[0], torch.tensor(float("inf")))
    _, again, _ = _trace(torch.nn.Identity(), lambda: nudged.clone())
    assert again.modules[0].outputs[0].fingerprint != value.fingerprint


def test_the_value_budget_and_the_op_limit() -> None:
    model = TinyGPT(depth=2).eval()
    x = tokens()
    _, trace, _ = _trace(model, lambda: model(x), TraceLimits(values_bytes=0))
    assert trace.values_bytes == 0 and trace.values_dropped > 0
    assert all(v.tensor is None and (v.fingerprint or not v.is_tensor or v.stats is None)
               for op in trace.ops for v in op.outputs)
    _, small, _ = _trace(model, lambda: model(x), TraceLimits(values_bytes=4096))
    assert 0 < small.values_bytes <= 4096 and small.values_dropped > 0
    _, cut, _ = _trace(model, lambda: model(x), TraceLimits(max_ops=10))
    full = len(_trace(model, lambda: model(x))[1].ops)
    assert len(cut.ops) == 10 and cut.truncated == full - 10


def test_uninitialised_outputs_get_no_fingerprint() -> None:
    """Dropout fills an empty_like tensor: what it held before is whatever the memory held."""
    dropout = torch.nn.Dropout(0.5)  # training mode: the default
    _, trace, _ = _trace(dropout, lambda: dropout(torch.ones(64)))
    empty = next(op for op in trace.ops if op.op.startswith("aten::empty"))
    assert empty.outputs[0].fingerprint is None and empty.outputs[0].stats is None and empty.outputs[0].tensor is None


def test_a_failing_statistics_function_stops_the_trace_not_the_call() -> None:
    def broken(tensor: torch.Tensor, quantiles: bool = False) -> dict[str, Any]:
        raise RuntimeError("boom")

    module = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    output, trace, recorder = _trace(module, lambda: module(x), stats=broken)
    assert torch.equal(output, module(x)) and recorder.error == "RuntimeError: boom" and trace.ops == []


def test_nested_recorders_do_not_see_each_others_reads() -> None:
    """A recorded target inside a recorded target: the inner recorder's copies and statistics are
    not ops of the outer call."""
    inner_module = torch.nn.Linear(4, 4)
    outer_module = torch.nn.Sequential(inner_module, torch.nn.ReLU())
    x = torch.randn(2, 4)

    inner: list[OpTrace] = []

    def run() -> torch.Tensor:
        hidden, trace, _ = _trace(inner_module, lambda: inner_module(x))
        inner.append(trace)
        return torch.relu(hidden)

    with torch.no_grad():  # (autograd saves a detached output of relu in one case and not the other)
        _, outer, _ = _trace(outer_module, run)
        _, alone, _ = _trace(outer_module, lambda: outer_module(x))
    assert [op.op for op in outer.ops] == [op.op for op in alone.ops] == ["aten::t", "aten::addmm", "aten::relu"]
    assert [op.op for op in inner[0].ops] == ["aten::t", "aten::addmm"]


def test_json_round_trip_and_its_checks() -> None:
    model = TinyGPT(depth=1).eval()
    _, trace, _ = _trace(model, lambda: model(tokens()))
    stored: dict[str, torch.Tensor] = {}

    def add(tensor: torch.Tensor, path: str) -> str:
        key = f"t{len(stored)}"
        stored[key] = tensor
        return key

    document = json.loads(json.dumps(trace.to_json(add), allow_nan=False))  # strict JSON
    entries = {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for k, t in stored.items()}
    checked = validate_op_trace(document, "trace", entries.get)
    again = OpTrace.from_json(dict(checked), stored.__getitem__)
    assert [(op.op, op.module, op.source) for op in again.ops] == [(op.op, op.module, op.source) for op in trace.ops]
    assert [v.fingerprint for op in again.ops for v in op.outputs] == [v.fingerprint for op in trace.ops for v in op.outputs]
    assert again.summary() == trace.summary()
    assert (TRACE_FORMAT, TRACE_VERSION) == (spec.OP_TRACE_FORMAT, spec.OP_TRACE_VERSION)  # the torch-free copy

    def broken(change: Any, message: str) -> None:
        bad = copy.deepcopy(document)
        change(bad)
        with pytest.raises(CorruptCaptureError, match=message):
            validate_op_trace(bad, "trace", entries.get)

    broken(lambda d: d.update(format="other"), "is not 'modulelens.op-trace'")
    broken(lambda d: d.update(version=TRACE_VERSION + 1), "upgrade modulelens")
    broken(lambda d: d["modules"][1].update(parent=5), "not an earlier module call")
    broken(lambda d: d["modules"][1].update(end=10**6), "not within")
    broken(lambda d: d["ops"][0].update(module=999), "not one of the")
    broken(lambda d: d["ops"][0].update(source=999), "not one of the")
    broken(lambda d: d["ops"][0]["outputs"][0].update(fingerprint="md5:00"), "xxh3_128")
    broken(lambda d: d["ops"][0]["outputs"][0].update(value="t999999"), "is not a stored")
    broken(lambda d: d["ops"][0]["outputs"][0].update(shape=[-1]), "shape")
    broken(lambda d: d["ops"][0]["outputs"][0].update(stats={"mean": [1]}), "expected a number")
    broken(lambda d: d.update(modules=[]), "empty")
    broken(lambda d: d["ops"][0].update(inputs=[["float32"]]), "not \\[dtype, shape\\]")

"""``Recording(op_trace=True)``: recorded calls carry their op trace into the capture; unrecorded
calls, and every call when the option is off, run without any dispatch mode."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from child_process import subprocess_env
from diverge_models import TinyGPT, tokens

import modulelens
from modulelens.errors import CaptureWarning, CorruptCaptureError, UsageError
from modulelens.format.validate import validate_capture


class _ModesSeen:
    """A forward pre-hook noting how many python dispatch modes are active at each call."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.counts: list[int] = []
        module.register_forward_pre_hook(lambda *_: self.counts.append(torch._C._len_torch_dispatch_stack()))


def test_only_recorded_calls_are_traced_and_the_trace_is_stored(repo: modulelens.Repo) -> None:
    torch.manual_seed(0)
    model = TinyGPT(depth=3).eval()
    seen = _ModesSeen(model.blocks[1].attn.qkv)
    with pytest.warns(CaptureWarning, match="hooks added after construction"), modulelens.capture(
            model, "blocks.1", repo=repo, name="gpt", record=modulelens.Recording(warmup=1, max_calls=1, op_trace=True)
    ) as cap:
        for seed in range(3):
            model(tokens(seed=seed))
    assert seen.counts == [0, 1, 0]  # the warm-up call and the one after the capture ran without a mode
    live = cap.records["blocks.1"].calls[0].op_trace
    assert live is not None and live.modules[0].path == "" and {"attn", "attn.qkv", "mlp.up"} <= {
        m.path for m in live.modules}  # paths relative to the target, as its capture names them
    loaded = modulelens.load("gpt/blocks.1", repo=repo)
    summary = loaded.metadata["calls"][0]["op_trace"]
    assert summary["ops"] == len(live.ops) and summary["modules"] == len(live.modules) and summary["values"] > 0
    trace = loaded.calls[0].op_trace
    assert trace is not None and [op.op for op in trace.ops] == [op.op for op in live.ops]
    assert [v.fingerprint for op in trace.ops for v in op.outputs] == [
        v.fingerprint for op in live.ops for v in op.outputs]
    kept = next(op.outputs[0] for op in trace.ops if op.outputs and op.outputs[0].tensor is not None)
    assert kept.tensor is not None and kept.tensor.dtype == torch.float32
    assert loaded.replay().passed  # a capture with a trace replays as any other


def test_the_option_off_costs_nothing_and_stores_nothing(repo: modulelens.Repo) -> None:
    model = TinyGPT(depth=2).eval()
    seen = _ModesSeen(model.blocks[0].attn.qkv)
    with pytest.warns(CaptureWarning, match="hooks added after construction"), modulelens.capture(
            model, "blocks.0", repo=repo, name="plain") as cap:
        model(tokens())
    assert seen.counts == [0] and cap.records["blocks.0"].calls[0].op_trace is None
    loaded = modulelens.load("plain/blocks.0", repo=repo)
    assert "op_trace" not in loaded.metadata["calls"][0] and loaded.calls[0].op_trace is None
    assert not loaded.calls[0].has_op_trace


def test_a_value_budget_of_zero_keeps_fingerprints_and_statistics_only(repo: modulelens.Repo) -> None:
    model = TinyGPT(depth=1).eval()
    with modulelens.capture(model, "", repo=repo, name="lean",
                            record=modulelens.Recording(op_trace=True, op_trace_values=0)):
        model(tokens())
    loaded = modulelens.load("lean", repo=repo)
    assert loaded.metadata["calls"][0]["op_trace"]["values"] == 0
    trace = loaded.calls[0].op_trace
    assert trace is not None and all(v.tensor is None for op in trace.ops for v in op.outputs)
    assert all(v.stats for op in trace.ops for v in op.outputs if v.fingerprint)


def test_bad_options_fail_before_the_job() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(UsageError, match="op_trace_values"):
            modulelens.Recording(op_trace=True, op_trace_values=bad)  # type: ignore[arg-type]


def test_a_damaged_trace_reference_is_refused(repo: modulelens.Repo) -> None:
    model = TinyGPT(depth=1).eval()
    with modulelens.capture(model, "", repo=repo, name="t", record=modulelens.Recording(op_trace=True)):
        model(tokens())
    meta: dict[str, Any] = json.loads(json.dumps(repo.read_metadata("t", 1)))
    validate_capture(meta, "t")  # as stored: valid
    for change, message in ((lambda m: m["calls"][0]["op_trace"].update(text_id="t99999"), "not a 1-D uint8"),
                            (lambda m: m["calls"][0]["op_trace"].update(ops=-1), "negative"),
                            (lambda m: m["calls"][0].update(op_trace=[]), "expected dict")):
        bad = copy.deepcopy(meta)
        change(bad)
        with pytest.raises(CorruptCaptureError, match=message):
            validate_capture(bad, "t")


def test_modulelens_run_records_the_op_trace(tmp_path: Path) -> None:
    """``modulelens run --op-trace`` on an unmodified script, in its own processes."""
    script = tmp_path / "job.py"
    script.write_text("import torch\nfrom diverge_models import TinyGPT, tokens\n"
                      "model = TinyGPT().eval()\nfor seed in range(2):\n    model(tokens(seed=seed))\n")
    done = subprocess.run([sys.executable, "-m", "modulelens", "run", "-t", "blocks.3.attn", "--op-trace",
                           "--op-trace-values", "0", "--repo", str(tmp_path / "repo"), "--name", "job", "--json",
                           "--", sys.executable, str(script)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [v["ref"] for v in json.loads(done.stdout)["result"]["saved"]] == ["job/blocks.3.attn:v1"]
    loaded = modulelens.load("job/blocks.3.attn", repo=tmp_path / "repo")
    summary = loaded.metadata["calls"][0]["op_trace"]
    assert summary["ops"] > 10 and summary["values"] == 0 and loaded.metadata["calls"][0]["index"] == 0
    trace = loaded.calls[0].op_trace
    assert trace is not None and {"qkv", "proj"} <= {call.path for call in trace.modules}

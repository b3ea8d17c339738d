"""The op trace and the locator on a third-party model at its default settings: transformers' GPT-2
built from a small config, in training mode with dropout on, as a job runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from diverge_gpt2 import EpsilonBlock, gpt2, token_ids

import modulelens


@pytest.fixture(scope="module")
def block(tmp_path_factory: pytest.TempPathFactory) -> modulelens.Capture:
    repo = modulelens.Repo(tmp_path_factory.mktemp("gpt2-repo"))
    model = gpt2()  # no .eval(): dropout draws masks, which the replay's restored RNG draws again
    with modulelens.capture(model, "h.1", repo=repo, name="gpt2", record=modulelens.Recording(op_trace=True)):
        model(token_ids())
    return modulelens.load("gpt2/h.1", repo=repo)


def test_the_trace_of_a_gpt2_block_and_its_replay(block: modulelens.Capture) -> None:
    trace = block.calls[0].op_trace
    assert trace is not None and block.calls[0].training
    paths = {call.path for call in trace.modules}
    assert {"ln_1", "attn", "attn.c_attn", "mlp.c_fc", "mlp.act", "mlp.dropout"} <= paths
    assert any(op.op.startswith("aten::bernoulli") for op in trace.ops)  # dropout ran, as in the job
    sources = {Path(trace.source_of(op) or "").name.split(":")[0] for op in trace.ops}
    assert "modeling_gpt2.py" in sources
    report = block.replay()
    assert report.passed and report.calls[0].divergence is None


def test_a_rewritten_block_is_located_to_its_layer_norm(block: modulelens.Capture) -> None:
    report = modulelens.verify(block, EpsilonBlock, timing=None, store=False)
    assert not report.passed
    divergence = report.calls[0].divergence
    assert divergence is not None and divergence.first is not None
    assert (divergence.first.reference.module, divergence.first.reference.op) == ("ln_2", "aten::native_layer_norm")
    assert "modeling_gpt2.py" in (divergence.first.reference.source or "")
    assert divergence.last_agreeing is not None and divergence.last_agreeing.op == "aten::add.Tensor"

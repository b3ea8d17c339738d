"""Backward capture reads the job's own backward (issue 11, item 5).

The recorded gradients are compared with an independent computation: ``torch.autograd.grad`` on a
fresh copy of the model, fed the same inputs (and the same RNG state, for dropout). The hard case
is a module that returns an intermediate it also uses itself (BART's ``model`` returns the
encoder's hidden state that its decoder consumes): a hook on the output sees the gradient of both
uses, so a second backward from the outputs counted the module's own use twice (or failed with
"backward through the graph a second time").
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import modulelens


class ReturnsIntermediate(nn.Module):
    """Returns ``h`` and ``y = f(h)``: the job uses ``h`` too, and so does the module."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.mix = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.inp(x)
        y = self.mix(self.drop(torch.tanh(h))) * h  # h used twice inside, and returned
        return h, y


def _loss(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (h * 3).sum() + y.pow(2).sum()


def _capture(model: nn.Module, target: str, run: Any, repo: modulelens.Repo) -> modulelens.Capture:
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)  # a backward not recorded fails here
        with modulelens.capture(model, targets=[target], repo=repo, name="bw", strict=True,
                                record=modulelens.Recording(backward=True)) as cap:
            run(model)
    return modulelens.load(cap.saved[0].ref, repo=repo)


def test_module_returning_an_intermediate_it_uses(repo: modulelens.Repo) -> None:
    with modulelens.track_init():
        model = ReturnsIntermediate().train()
    fresh = copy.deepcopy(model)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def run(m: nn.Module) -> None:
        torch.manual_seed(7)
        _loss(*m(x.clone().requires_grad_(True))).backward()

    cap = _capture(model, "ReturnsIntermediate", run, repo)
    recorded = cap.calls[0].backward
    assert recorded is not None

    torch.manual_seed(7)  # the same dropout mask
    leaf = x.clone().requires_grad_(True)
    h, y = fresh(leaf)
    names = [n for n, _ in fresh.named_parameters()]
    expected = torch.autograd.grad(_loss(h, y), [leaf, h, y, *fresh.parameters()])
    grad_x, grad_h_external, grad_y, *param_grads = expected
    assert torch.equal(recorded["input_grads"][0][0], grad_x)
    assert torch.equal(recorded["output_grads"][0], torch.full_like(h, 3.0))  # only the job's use of h
    assert torch.equal(recorded["output_grads"][1], grad_y)
    for name, grad in zip(names, param_grads, strict=True):
        assert torch.equal(recorded["param_grads"][name], grad), name
        assert torch.equal(dict(model.named_parameters())[name].grad, grad)  # the job's own gradients untouched
    del grad_h_external
    report = cap.replay(backward=True)
    assert report.status == "PASS" and report.mode == "bit-exact", report


def test_bart_gradients_match_an_independent_computation(repo: modulelens.Repo) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    with modulelens.track_init():
        model = transformers.BartForConditionalGeneration(config).train()  # default dropout on
    fresh = copy.deepcopy(model)
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))

    def run(m: nn.Module) -> None:
        torch.manual_seed(5)
        m(input_ids=ids, labels=ids).loss.backward()

    cap = _capture(model, "model", run, repo)
    recorded = cap.calls[0].backward
    assert recorded is not None
    # Independent: the same forward on a fresh copy whose LM head is untied from the shared
    # embedding, so the gradients of `model`'s parameters are exactly its own (module-local) ones.
    fresh.lm_head.weight = nn.Parameter(fresh.lm_head.weight.detach().clone())
    torch.manual_seed(5)
    loss = fresh(input_ids=ids, labels=ids).loss
    named = list(fresh.model.named_parameters())
    expected = torch.autograd.grad(loss, [p for _, p in named])
    assert len(named) > 40
    for (name, _), grad in zip(named, expected, strict=True):
        assert torch.equal(recorded["param_grads"][name], grad), name
    report = cap.replay(backward=True)
    assert report.status == "PASS" and report.mode == "bit-exact", report


def test_self_attention_given_one_tensor_three_times_runs_as_without_the_capture(repo: modulelens.Repo) -> None:
    """``attn(x, x, x)``: each argument got a view of its own, so ``nn.MultiheadAttention`` no
    longer saw ``query is key is value`` and took its general path: the job's outputs and
    gradients changed under a backward capture (7e-8), and the recorded per-argument gradients,
    each a part of the sum, failed a replay passing one tensor three times (found with fair-esm)."""

    def job(capture: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, modulelens.Capture | None]:
        torch.manual_seed(0)
        with modulelens.track_init():
            attn = nn.MultiheadAttention(8, 2)
        x = torch.randn(5, 2, 8, requires_grad=True)

        def step(module: nn.Module) -> torch.Tensor:
            out, _ = module(x, x, x)
            out.sum().backward()
            return out.detach()

        if not capture:
            return step(attn), x.grad, attn.in_proj_weight.grad, None  # type: ignore[return-value]
        outputs: list[torch.Tensor] = []
        cap = _capture(attn, "", lambda m: outputs.append(step(m)), repo)
        return outputs[0], x.grad, attn.in_proj_weight.grad, cap  # type: ignore[return-value]

    *without, _ = job(capture=False)
    *with_capture, cap = job(capture=True)
    for name, alone, captured in zip(["output", "x.grad", "in_proj_weight.grad"], without, with_capture, strict=True):
        assert torch.equal(alone, captured), name
    assert cap is not None
    report = cap.replay(backward=True)
    assert report.status == "PASS" and report.mode == "bit-exact", report


def test_a_call_no_backward_reached_says_so_not_to_capture_with_backward(repo: modulelens.Repo) -> None:
    """A call whose output carries no gradient (an audio codec's integer codes), captured with
    ``backward=True``: replay(backward=True) advised "capture with record=Recording(backward=True)",
    which the capture had done (found with encodec)."""

    class Codes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x).argmax(-1)

    with modulelens.track_init():
        model = Codes()
    x = torch.randn(3, 4, requires_grad=True)
    with modulelens.capture(model, targets=[""], repo=repo, name="codes", record=modulelens.Recording(backward=True)):
        model(x)
    report = modulelens.load("codes", repo=repo).replay(backward=True)
    assert report.status == "FAIL"
    assert report.calls[0].error == ("no backward was recorded for this call (none reached it in the job: no output "
                                     "of it required grad, or no backward ran through one)")

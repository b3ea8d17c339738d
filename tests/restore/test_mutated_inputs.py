"""Inputs a call changes in place (issue 11, item 2): caches and in-place tensor updates.

A module that appends to a cache it was given, or updates an input tensor in place, is recorded
twice over: the input as it was on entry (what the replay feeds in) and as it was after the call
(``Call.mutated_inputs``, what the replay compares the replayed input with). transformers' caches
are state objects (``register_state_codec``); user classes can be registered the same way.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import modulelens
from modulelens.errors import UntrustedCodeError
from modulelens.format.values import DecodeContext, EncodeContext, decode_value, encode_value


class TokenCache:
    """A user-defined cache: grows by one entry per call, its length kept alongside."""

    def __init__(self) -> None:
        self.entries: list[torch.Tensor] = []
        self.length = 0


modulelens.register_state_codec(TokenCache)


class Appender(nn.Module):
    """Attends over what the cache holds, then appends its own projection to it (in place)."""

    def __init__(self, forget: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.forget = forget

    def forward(self, x: torch.Tensor, cache: TokenCache) -> torch.Tensor:
        keys = self.proj(x)
        past = torch.stack(cache.entries).sum(0) if cache.entries else torch.zeros_like(keys)
        if not self.forget:
            cache.entries.append(keys)
            cache.length += 1
        return keys + past


class Scales(nn.Module):
    """Updates its input tensor in place and returns nothing that shows it."""

    def __init__(self, factor: float = 2.0) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(self.factor)
        return x.sum()


def _capture(model: nn.Module, repo: modulelens.Repo, drive: Any, max_calls: int) -> modulelens.Capture:
    with modulelens.track_init():
        model = type(model)()
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)
        with modulelens.capture(model, targets=[type(model).__name__], repo=repo, name="m", strict=True,
                                record=modulelens.Recording(max_calls=max_calls)) as cap:
            drive(model)
    return modulelens.load(cap.saved[0].ref, repo=repo)


def _drive_cache(model: nn.Module) -> None:
    cache = TokenCache()
    for step in range(2):
        model(torch.full((1, 4), float(step + 1)), cache)


def test_state_object_input_is_recorded_on_entry_and_after_the_call(repo: modulelens.Repo) -> None:
    cap = _capture(Appender(), repo, _drive_cache, max_calls=2)
    assert cap.metadata["unrecorded"] == []
    first, second = cap.calls
    assert first.kwargs == {} and first.args[1].length == 0 and first.args[1].entries == []
    assert second.args[1].length == 1 and len(second.args[1].entries) == 1  # as on entry, not as at save time
    after = second.mutated_inputs["[0][1]"]
    assert isinstance(after, TokenCache) and after.length == 2
    assert torch.equal(after.entries[0], second.args[1].entries[0])
    report = cap.replay()
    assert report.status == "PASS", report
    paths = [leaf.path for leaf in report.calls[1].leaves]
    assert "args[1](after the call)['entries'][1]" in paths and "args[1](after the call)['length']" in paths


def test_replay_that_does_not_update_the_cache_fails(repo: modulelens.Repo) -> None:
    cap = _capture(Appender(), repo, _drive_cache, max_calls=2)
    forgetful = Appender(forget=True)
    forgetful.load_state_dict(cap.module.state_dict())
    report = cap.replay(module=forgetful)
    assert report.status == "FAIL"
    worst = report.calls[0].worst
    assert worst is not None and worst.path.startswith("<args[1](after the call)>")  # the output itself matched
    assert all(leaf.passed for leaf in report.calls[0].leaves if leaf.path.startswith("output"))


def test_tensor_input_updated_in_place_is_compared_after_the_call(repo: modulelens.Repo) -> None:
    cap = _capture(Scales(), repo, lambda m: m(torch.arange(4.0)), max_calls=1)
    call = cap.calls[0]
    assert torch.equal(call.args[0], torch.arange(4.0))  # on entry
    assert torch.equal(call.mutated_inputs["[0][0]"], torch.arange(4.0) * 2)
    assert cap.replay().status == "PASS"
    report = cap.replay(module=Scales(factor=3.0))
    assert [leaf.path for leaf in report.calls[0].leaves if not leaf.passed] == ["output", "args[0](after the call)"]


def test_state_codec_rebuilds_only_its_own_classes() -> None:
    tensors: dict[str, torch.Tensor] = {}

    def add(tensor: torch.Tensor, _path: str) -> str:
        tensors[f"t{len(tensors)}"] = tensor
        return f"t{len(tensors) - 1}"

    cache = TokenCache()
    cache.entries.append(torch.ones(2))
    data = encode_value(cache, EncodeContext(add_tensor=add), "cache")
    ctx = DecodeContext(get_tensor=tensors.__getitem__)
    copy = decode_value(data, ctx)
    assert type(copy) is TokenCache and copy.length == 0 and torch.equal(copy.entries[0], torch.ones(2))
    data["class"] = "collections:OrderedDict"  # capture data naming a class the codec was not registered for
    with pytest.raises(UntrustedCodeError, match=r"collections:OrderedDict is not a .*TokenCache type; refused"):
        decode_value(data, ctx)


def test_transformers_cache_on_entry_and_after_a_decode_step(repo: modulelens.Repo) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with modulelens.track_init():
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(0))
    with modulelens.capture(model, targets=["model.layers.1.self_attn"], repo=repo, name="llama", strict=True,
                            record=modulelens.Recording(max_calls=2)) as cap:
        out = model(input_ids=ids)  # default settings: use_cache=True, a DynamicCache
        model(input_ids=ids[:, -1:], past_key_values=out.past_key_values)
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    prefill, decode = loaded.calls
    (path, cache), = decode.mutated_inputs.items()
    entry = dict(decode.kwargs)[path.removeprefix("[1]['").removesuffix("']")]
    assert type(cache) is type(out.past_key_values)
    # layer 1's attention sees layer 0 already updated by this step, its own layer not yet
    assert (entry.get_seq_length(0), entry.get_seq_length(1)) == (8, 7)  # on entry
    assert (cache.get_seq_length(0), cache.get_seq_length(1)) == (8, 8)  # after the call
    assert prefill.mutated_inputs[path].get_seq_length(1) == 7
    assert loaded.replay().status == "PASS"

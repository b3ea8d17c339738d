"""live_state's one-pass key and fingerprints (tracing/fingerprint.py): the same names, order, key
and fingerprints as the general path, tied weights fingerprinted once, and every write seen."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modulelens
from modulelens.tracing.fingerprint import fingerprints, live_state


class _Tied(nn.Module):
    """One Linear under two names (a shared submodule), one Parameter under two names, buffers of
    every shape the fast path must leave to the general one (sparse-free here: a view, a transposed
    view, an empty tensor, a large weight that is summed, not hashed)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = self.a
        self.head = nn.Linear(3, 3, bias=False)
        self.head.weight = self.a.weight  # tied as language models tie embedding and head
        self.big = nn.Linear(600, 600)  # 1.4 MiB: summed on its device
        self.register_buffer("view", torch.arange(10.0)[2:7])
        self.register_buffer("transposed", torch.arange(12.0).reshape(3, 4).t())
        self.register_buffer("empty", torch.empty(0))
        self.register_buffer("absent", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x)))


def _reference(module: nn.Module) -> tuple[list[str], list[str], tuple[object, ...], tuple[int, ...]]:
    """What live_state was before the one-pass version: torch's own walks, then a key and
    :func:`fingerprints` of every tensor, duplicates included."""
    params = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    tensors = [*params.values(), *buffers.values()]
    key = tuple((id(t), t._version, t.data_ptr()) for t in tensors)
    return list(params), list(buffers), key, fingerprints(tensors)


@pytest.mark.parametrize("build", [_Tied, lambda: nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.BatchNorm1d(4))])
def test_live_state_matches_the_general_path(build: type[nn.Module]) -> None:
    module = build()
    params, buffers, (key, prints) = live_state(module)
    names, buffer_names, reference_key, reference_prints = _reference(module)
    assert list(params) == names and list(buffers) == buffer_names
    assert key == reference_key
    assert prints == reference_prints
    assert all(value != 0 for value, tensor in zip(prints, [*params.values(), *buffers.values()], strict=True)
               if tensor.numel())  # every non-empty tensor has a real fingerprint


def test_a_tied_weight_has_one_fingerprint_under_each_name_and_its_writes_show() -> None:
    module = _Tied()
    params, _, (_, before) = live_state(module)
    names = list(params)
    prints = dict(zip(names, before, strict=False))
    assert prints["a.weight"] == prints["b.weight"] == prints["head.weight"]
    with torch.no_grad():
        module.head.weight.data[0, 0] += 1.0  # through .data: the version counter stays
        module.big.weight.data[5, 7] += 1.0
    _, _, (_, after) = live_state(module)
    changed = {name for name, old, new in zip(names, before, after, strict=False) if old != new}
    assert changed == {"a.weight", "b.weight", "head.weight", "big.weight"}


def test_a_tied_weight_written_through_data_between_calls_is_a_new_state(repo: modulelens.Repo) -> None:
    model = _Tied()
    with modulelens.capture(model, targets=[""], repo=repo, record=modulelens.Recording(max_calls=3)) as cap, \
            torch.no_grad():
        model(torch.randn(2, 3))
        model.head.weight.data.copy_(model.head.weight.data.flip(1))  # a permutation, through .data
        model(torch.randn(2, 3))
        model(torch.randn(2, 3))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert [c.state_index for c in loaded.calls] == [0, 1, 1]
    assert loaded.replay().passed


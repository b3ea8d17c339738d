"""Captures are named by their module path (found by the census, issue 34).

MONAI's EfficientNets keep their blocks in ``_blocks``: a capture of ``_blocks.0`` was refused by
the name rules ("segments that start with a letter or digit"), and the refusal dropped every
capture of the job, the model's own included. A segment may now start with "_", and a module path
that no name can hold (a segment over 128 characters) costs only its own capture, with a warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import modulelens
from modulelens.errors import CaptureWarning, InvalidNameError
from modulelens.repo.names import validate_name


def test_a_submodule_under_an_underscore_attribute_is_captured_and_replays(tmp_path: Path) -> None:
    nets = pytest.importorskip("monai.networks.nets")
    model = nets.EfficientNetBN("efficientnet-b0", pretrained=False, spatial_dims=2, in_channels=1, num_classes=2)
    images = torch.rand(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    with modulelens.capture(model, targets=[".", "_blocks.0"], repo=tmp_path, name="effnet") as cap:
        model(images)
    assert sorted(info.name for info in cap.saved) == ["effnet", "effnet/_blocks.0"]
    for name in ("effnet", "effnet/_blocks.0"):
        report = modulelens.load(name, repo=tmp_path).replay()
        assert (report.status, report.mode) == ("PASS", "bit-exact"), str(report)


class _Deep(nn.Module):
    """A model whose one submodule's path is longer than a name segment may be (128 characters)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 3)
        inner = nn.Module()
        inner.add_module("b" * 70, nn.Linear(3, 3))
        self.add_module("a" * 70, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(getattr(self, "a" * 70), "b" * 70)(self.head(x))


def test_a_module_path_no_name_can_hold_costs_only_its_own_capture(tmp_path: Path) -> None:
    model = _Deep()
    deep = f"{'a' * 70}.{'b' * 70}"
    with pytest.raises(InvalidNameError):
        validate_name(f"deep/{deep}")
    with pytest.warns(CaptureWarning, match=f"capture of '{deep}' is not saved: invalid capture name"):
        with modulelens.capture(model, targets=[".", "head", deep], repo=tmp_path, name="deep") as cap:
            model(torch.ones(2, 3))
    assert sorted(info.name for info in cap.saved) == ["deep", "deep/head"]


def test_a_segment_still_never_names_a_path() -> None:
    for bad in (".", "..", "a/../b", "a//b", "/a", "a/.hidden", "-a"):
        with pytest.raises(InvalidNameError):
            validate_name(bad)
    assert validate_name("model/_blocks.0") == "model/_blocks.0"

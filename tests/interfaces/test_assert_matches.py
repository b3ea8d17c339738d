"""modulelens.testing.assert_matches on captures taken during training (issue 23, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tools_models as tm
import torch

import modulelens
from modulelens.errors import MatchError
from modulelens.testing import assert_matches

pytest_plugins = ["pytester"]
SUPPORT = Path(__file__).resolve().parent.parent / "support"


class PackedNormed(torch.nn.Module):
    """A rewrite of ``tools_models.Normed`` with its own parameter layout (weight and bias in one
    tensor), built from the original by ``from_original``: its state dict never takes the recorded one."""

    def __init__(self, packed: torch.Tensor, bn: torch.nn.BatchNorm1d) -> None:
        super().__init__()
        self.packed = torch.nn.Parameter(packed)
        self.bn = bn

    @classmethod
    def from_original(cls, original: tm.Normed) -> PackedNormed:
        packed = torch.cat([original.lin.weight.detach(), original.lin.bias.detach()[:, None]], 1).clone()
        bn = torch.nn.BatchNorm1d(original.bn.num_features)
        bn.load_state_dict(original.bn.state_dict())
        return cls(packed, bn)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        y = self.bn(torch.nn.functional.linear(x, self.packed[:, :-1], self.packed[:, -1])) * scale
        return y, {"mean": y.mean()}


class WrongPacked(PackedNormed):
    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        y, aux = super().forward(x, scale=scale)
        return y * 1.01, aux


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> modulelens.Capture:
    """Three recorded training calls of ``Normed`` with an optimizer step between them (3 states)."""
    root = tmp_path_factory.mktemp("training")
    torch.manual_seed(0)
    cap = modulelens.load(tm.capture_training(root, "train"), repo=root)
    assert len({c.state_index for c in cap.calls}) == 3
    return cap


def test_a_rewrite_built_by_from_original_passes_on_every_recorded_state(training: modulelens.Capture) -> None:
    """The README recipe, ``assert_matches(FusedMLP.from_original(cap.module), cap)``, on a training capture."""
    report = assert_matches(PackedNormed.from_original(training.module), training)
    assert report.passed and len(report.calls) == 3
    assert any("PackedNormed.from_original(the original module)" in note for note in report.notes)
    assert assert_matches(PackedNormed, training).passed  # the class: verify builds it per state


def test_a_wrong_rewrite_fails_and_the_message_counts_the_calls(training: modulelens.Capture) -> None:
    with pytest.raises(MatchError) as info:
        assert_matches(WrongPacked.from_original(training.module), training)
    message = str(info.value)
    assert message.startswith("WrongPacked does not reproduce train/inner:v1 (3 of 3 calls failed, per-dtype tolerances)")
    assert "call 0: output[0]: " in message


def test_no_way_to_give_the_recorded_weights_is_said_with_the_counts(training: modulelens.Capture) -> None:
    class Opaque(torch.nn.Module):  # neither the recorded parameter names nor from_original
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(6))

        def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
            return x * self.w

    with pytest.raises(MatchError) as info:
        assert_matches(Opaque(), training)
    message = str(info.value)
    assert "(0 of 0 checked calls failed, 3 of 3 not checked" in message
    assert "no from_original(original)" in message and "calls by state" in message


def test_the_readme_pytest_recipe_on_a_training_capture(training: modulelens.Capture, pytester: pytest.Pytester) -> None:
    """The README's recipe as a real pytest run (the plugin loads the capture by marker)."""
    import importlib.metadata

    pytester.syspathinsert(SUPPORT)
    pytester.syspathinsert(Path(__file__).resolve().parent)
    installed = any(ep.name == "modulelens" for ep in importlib.metadata.entry_points(group="pytest11"))
    pytester.makepyfile(test_golden=f"""
        import pytest, modulelens.testing
        from test_assert_matches import PackedNormed as FusedMLP

        @pytest.mark.modulelens("train/inner:v1", repo={str(training.repo.location)!r})
        def test_fused_mlp_matches(modulelens_capture):
            modulelens.testing.assert_matches(FusedMLP.from_original(modulelens_capture.module), modulelens_capture)
    """)
    result = pytester.runpytest(*([] if installed else ["-p", "modulelens_pytest"]), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)

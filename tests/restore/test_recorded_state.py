"""A loaded module behaves like the captured one (issue 11): it is in the recorded mode, its
constructor arguments are those it was built with (not what a builder or caller changed later),
attributes set after construction come back, and a structure changed after construction is named.

Third-party modules with their default settings: transformers layers from configs, timm models
with ``pretrained=False``.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from torch import nn

import modulelens
from modulelens.errors import InvalidNameError, UsageError

transformers = pytest.importorskip("transformers")


def _timm():
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    from timm_support import import_timm

    return import_timm()


def _capture_one(repo: modulelens.Repo, model: nn.Module, target: str, drive, name: str = "job") -> modulelens.Capture:
    with modulelens.capture(model, targets=[target], repo=repo, name=name, strict=True) as cap:
        drive(model)
    assert len(cap.saved) == 1, cap.saved
    return modulelens.load(cap.saved[0].ref, repo=repo)


def _readme_call(cap: modulelens.Capture) -> None:
    """The README's first example: the loaded module on the recorded inputs gives the recorded output."""
    call = cap.calls[0]
    with torch.random.fork_rng():
        torch.set_rng_state(call.rng["cpu"])
        out = cap.module(*call.args, **call.kwargs)
    expected, actual = torch.utils._pytree.tree_leaves(call.output), torch.utils._pytree.tree_leaves(out)
    tensors = [(e, a) for e, a in zip(expected, actual, strict=True) if isinstance(e, torch.Tensor)]
    assert tensors
    for e, a in tensors:
        assert torch.equal(e, a)


# ------------------------------------------------------------------------------------- item 1: mode


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32)
    return transformers.GPT2Model(config), "h.0.mlp", lambda m: m(torch.randint(0, 64, (2, 8)))


def _bert():
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=64, max_position_embeddings=32)
    return transformers.BertModel(config), "encoder.layer.0", lambda m: m(torch.randint(0, 64, (2, 8)))


def _t5():
    config = transformers.T5Config(num_layers=2, d_model=32, d_ff=64, num_heads=4, d_kv=8, vocab_size=64)
    ids = torch.randint(0, 64, (2, 8))
    return transformers.T5EncoderModel(config), "encoder.block.0", lambda m: m(input_ids=ids)


@pytest.mark.parametrize("build", [_gpt2, _bert, _t5], ids=["gpt2", "bert", "t5"])
def test_module_loads_in_the_mode_of_its_recorded_call(repo, build) -> None:
    torch.manual_seed(0)
    model, target, drive = build()
    model.eval()  # an inference job: dropout off
    cap = _capture_one(repo, model, target, drive)
    assert cap.module.training is False
    _readme_call(cap)  # dropout would make this differ if the module came back in training mode


def test_module_recorded_in_training_mode_loads_in_training_mode(repo) -> None:
    torch.manual_seed(0)
    model, target, drive = _bert()  # train mode: the default after construction
    cap = _capture_one(repo, model, target, drive)
    assert cap.module.training is True
    _readme_call(cap)  # same dropout masks from the recorded RNG state
    assert cap.replay().passed


def test_calls_in_both_modes_are_noted(repo) -> None:
    model, target, drive = _bert()

    def train_then_eval(m):
        drive(m.train())
        drive(m.eval())

    with modulelens.capture(model, targets=[target], repo=repo, name="job", record=modulelens.Recording(max_calls=2)) as cap:
        train_then_eval(model)
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert loaded.module.training is True
    assert any("both training and eval mode" in note for note in loaded.notes)
    assert loaded.replay().passed


# ------------------------------------------------------------------------ item 4: live arguments


class Scaled(nn.Module):
    def __init__(self, sizes: dict[str, int], options: list[dict[str, float]]):
        super().__init__()
        self.sizes = dict(sizes)
        self.scale = options[0].pop("scale")  # a builder that consumes its arguments, like timm's
        self.linear = nn.Linear(sizes["in"], sizes["out"])

    def forward(self, x):
        return self.linear(x) * self.scale


def test_arguments_changed_after_construction_do_not_change_the_rebuild(repo) -> None:
    sizes = {"in": 4, "out": 3}
    model = Scaled(sizes, [{"scale": 2.0}])
    sizes["out"] = 99  # the caller reuses its dict afterwards
    cap = _capture_one(repo, model, ".", lambda m: m(torch.randn(2, 4)))
    assert cap.init_arguments == (({"in": 4, "out": 3}, [{"scale": 2.0}]), {})
    assert cap.replay().passed


@pytest.mark.parametrize("arch", ["efficientnet_b0", "mobilenetv3_small_050"])
def test_timm_builders_that_pop_their_block_arguments_rebuild(repo, arch) -> None:
    timm = _timm()
    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, num_classes=10)  # train mode, as created
    cap = _capture_one(repo, model, ".", lambda m: m(torch.randn(2, 3, 32, 32)))
    report = cap.replay()
    assert report.passed, report


# ---------------------------------------------------------- item 6: state set after construction


def test_attribute_set_after_construction_is_restored(repo) -> None:
    timm = _timm()
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              depth=2, num_classes=10)
    model.set_distilled_training(True)  # train mode returns (head, head_dist) separately now
    cap = _capture_one(repo, model, ".", lambda m: m(torch.randn(2, 3, 32, 32)))
    assert cap.module.distilled_training is True
    assert any("distilled_training" in note for note in cap.notes)
    assert isinstance(cap.calls[0].output, tuple)
    report = cap.replay()
    assert report.passed, report


@pytest.mark.parametrize("reentrant", [False, True], ids=["default", "reentrant"])
def test_a_block_of_a_model_trained_with_gradient_checkpointing_replays(repo, reentrant) -> None:
    """transformers' gradient_checkpointing_enable() leaves every block with ``gradient_checkpointing
    = True`` and a partial of torch's checkpoint: both come back, so the replay runs the block as the
    job did (it failed on the missing partial), and each training step's call is recorded once (the
    reentrant form ran the block again in the backward, and that run was recorded as a call)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    model.gradient_checkpointing_enable({"use_reentrant": True} if reentrant else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 8))
    with modulelens.capture(model, targets=["transformer.h.0"], repo=repo, name="ckpt", strict=True,
                            record=modulelens.Recording(max_calls=3)):
        for _ in range(2):
            model(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    cap = modulelens.load("ckpt/transformer.h.0", repo=repo)
    assert [call.state_index for call in cap.calls] == [0, 1]
    assert cap.module._gradient_checkpointing_func.keywords == {"use_reentrant": reentrant}
    assert any("_gradient_checkpointing_func" in note for note in cap.notes), cap.notes
    report = cap.replay()
    assert report.passed, report


def test_only_partials_a_load_may_resolve_are_recorded_as_attributes() -> None:
    """A partial attribute is recorded when its function is one a load may name (the import rules);
    a partial of a denied or local function is left out as before, never a save or load that fails."""
    import functools
    import os.path

    from modulelens.format.module_state import plain_attributes

    def local(x: torch.Tensor) -> torch.Tensor:
        return x

    module = nn.Linear(2, 2)
    module.dropout = functools.partial(torch.nn.functional.dropout, p=0.1)
    module.ckpt = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    module.denied = functools.partial(os.path.join, "a")
    module.local = functools.partial(local)
    module.untyped = functools.partial(torch.nn.functional.dropout, torch.ones(1))  # a tensor argument
    assert set(plain_attributes(module)[""]) == {"in_features", "out_features", "dropout", "ckpt"}


def test_structure_changed_after_construction_is_rebuilt_and_init_overrides_rebuild_it(repo) -> None:
    timm = _timm()
    from timm.utils.model import reparameterize_model

    torch.manual_seed(0)
    model = timm.create_model("fastvit_t8", pretrained=False, num_classes=10)
    model = reparameterize_model(model)  # branches fused into one conv each: a new structure
    cap = _capture_one(repo, model, ".", lambda m: m(torch.randn(1, 3, 64, 64)))
    # the fused convs are put back from their own construction records (issue 22)
    assert cap.replay().passed
    assert any("rebuilt from the recorded submodules: stem.0.reparam_conv" in note for note in cap.notes)
    assert cap.init_arguments[1].get("inference_mode", False) is False  # as recorded
    rebuilt = modulelens.load(cap.ref, repo=repo, init_overrides={"inference_mode": True})
    assert rebuilt.init_arguments[1]["inference_mode"] is True  # what the module is built with
    report = rebuilt.replay()
    assert report.passed, report


def test_init_overrides_names_an_argument_the_constructor_does_not_take(repo) -> None:
    cap = _capture_one(repo, nn.LayerNorm(4), ".", lambda m: m(torch.randn(2, 4)))
    assert modulelens.load(cap.ref, repo=repo, init_overrides={"eps": 0.5}).module.eps == 0.5
    with pytest.raises(UsageError, match="'epsilon'"):
        _ = modulelens.load(cap.ref, repo=repo, init_overrides={"epsilon": 0.5}).module


# ---------------------------------------------------------------------------- item 10: names


def test_bad_capture_name_is_rejected_before_the_job_runs(repo) -> None:
    ran = []
    with pytest.raises(InvalidNameError):
        with modulelens.capture(nn.Linear(2, 2), targets=["."], repo=repo, name="bad name!"):
            ran.append(True)
    assert not ran


@pytest.mark.parametrize("root", ["", "."])
def test_root_is_targeted_by_an_empty_name_or_a_dot(repo, root) -> None:
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=64, max_position_embeddings=32)
    model = transformers.BertModel(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)
        cap = _capture_one(repo, model, root, lambda m: m(torch.randint(0, 64, (2, 8))), name="bert")
    assert cap.name == "bert" and cap.module_class.endswith(":BertModel")
    assert cap.replay().passed

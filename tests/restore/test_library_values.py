"""Issue 34, defect 4: values the libraries' own modules hold or pass that blocked their captures.

openai-whisper's sparse non-persistent ``alignment_heads`` buffer, vector-quantize-pytorch's EMA
codebook in a training capture, transformers' ``BatchEncoding`` (what sentence-transformers passes
between its modules) and inputs made under ``torch.inference_mode()``; each captured here and
replayed in a fresh process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from child_process import replay_in_fresh_process
from method_models import FeatureWriter

import modulelens
from modulelens.errors import RestoreError, ToolError

SUPPORT = Path(__file__).resolve().parents[1] / "support"




def _whisper() -> torch.nn.Module:
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(n_mels=8, n_audio_ctx=8, n_audio_state=16, n_audio_head=2, n_audio_layer=1, n_vocab=64,
                           n_text_ctx=8, n_text_state=16, n_text_head=2, n_text_layer=2)
    model = Whisper(dims)
    # The decoder's positional embedding is torch.empty until a checkpoint fills it: uninitialised
    # memory can be all NaN, and a NaN-only output is (rightly) UNVERIFIED. Fill it as a load would.
    with torch.no_grad():
        model.decoder.positional_embedding.normal_(generator=torch.Generator().manual_seed(0))
    return model


def _capture_strictly(model: torch.nn.Module, targets: list[str], repo: Path, name: str, job: Any,
                      calls: int = 1) -> list[modulelens.VersionInfo]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)  # nothing dropped, nothing unrecorded
        with modulelens.capture(model, targets, repo=repo, name=name, record=modulelens.Recording(max_calls=calls)) as cap:
            job()
    return cap.saved


def test_whisper_with_its_sparse_alignment_heads_is_captured(tmp_path: Path) -> None:
    model = _whisper().eval()
    assert model.alignment_heads.layout == torch.sparse_coo  # the buffer that blocked the whole capture
    mel, tokens = torch.randn(1, 8, 16), torch.tensor([[1, 2, 3]])
    saved = _capture_strictly(model, ["."], tmp_path / "repo", "whisper", lambda: model(mel, tokens))
    state = modulelens.load(saved[0].ref, repo=tmp_path / "repo").metadata["states"][0]
    assert "alignment_heads" not in state["buffers"]
    assert state["rebuilt_buffers"]["alignment_heads"]["layout"] == "sparse_coo"
    results = replay_in_fresh_process(tmp_path / "repo", {"whisper": saved[0].ref})
    assert results["whisper"]["status"] == "PASS" and results["whisper"]["mode"] == "bit-exact", results


def test_alignment_heads_changed_after_construction_fail_loudly_on_load(tmp_path: Path) -> None:
    """Not stored, so a value the constructor does not make again must not replay silently."""
    model = _whisper().eval()
    heads = torch.zeros(2, 2, dtype=torch.bool)
    heads[0, 1] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)  # as set_alignment_heads does
    saved = _capture_strictly(model, ["."], tmp_path / "repo", "whisper",
                              lambda: model(torch.randn(1, 8, 16), torch.tensor([[1, 2]])))
    with pytest.raises(RestoreError, match=r"buffer alignment_heads \(sparse_coo, not persistent\) was not stored"):
        modulelens.load(saved[0].ref, repo=tmp_path / "repo").module  # noqa: B018


def test_vector_quantizer_training_capture_replays_every_call(tmp_path: Path) -> None:
    """Its EMA codebook changes every training call; switching to a later state copied the buffers
    outside no_grad and call 1 raised "a view of a leaf Variable that requires grad..."."""
    from vector_quantize_pytorch import VectorQuantize

    torch.manual_seed(0)
    vq = VectorQuantize(dim=8, codebook_size=16, decay=0.8, commitment_weight=1.0).train()

    def train() -> None:
        for _ in range(3):
            _, _, loss = vq(torch.randn(2, 5, 8))
            loss.backward()
    saved = _capture_strictly(vq, ["."], tmp_path / "repo", "vq", train, calls=3)
    capture = modulelens.load(saved[0].ref, repo=tmp_path / "repo")
    assert len(capture.calls) == 3 and len({c.state_index for c in capture.calls}) == 3
    results = replay_in_fresh_process(tmp_path / "repo", {"vq": saved[0].ref})
    assert results["vq"]["status"] == "PASS" and results["vq"]["calls"] == 3, results["vq"].get("report")


def test_a_batch_encoding_a_module_writes_into_is_recorded_before_and_after(tmp_path: Path) -> None:
    from transformers.tokenization_utils_base import BatchEncoding

    module = FeatureWriter()
    batch = BatchEncoding({"input_ids": torch.tensor([[1, 2, 3]]), "attention_mask": torch.ones(1, 3)}, n_sequences=1)
    saved = _capture_strictly(module, ["."], tmp_path / "repo", "features", lambda: module(batch))
    capture = modulelens.load(saved[0].ref, repo=tmp_path / "repo")
    [given] = capture.calls[0].args
    assert type(given) is BatchEncoding and set(given) == {"input_ids", "attention_mask"}  # as it was on entry
    assert set(capture.calls[0].output) == {"input_ids", "attention_mask", "token_embeddings"}
    results = replay_in_fresh_process(tmp_path / "repo", {"features": saved[0].ref})
    assert results["features"]["status"] == "PASS" and results["features"]["mutated_leaves"] >= 1, results


def test_inputs_made_under_inference_mode_are_recorded(tmp_path: Path) -> None:
    """sentence-transformers' encode runs under inference_mode: its tensors have no version counter."""
    model = torch.nn.Bilinear(3, 3, 2)
    with torch.inference_mode():
        x, y = torch.randn(2, 3), torch.randn(2, 3)
        saved = _capture_strictly(model, ["."], tmp_path / "repo", "bilinear", lambda: model(x, y))
    results = replay_in_fresh_process(tmp_path / "repo", {"bilinear": saved[0].ref})
    assert results["bilinear"]["status"] == "PASS", results


@pytest.mark.parametrize("same_minibatch", [True, False])
def test_a_torch_func_ensemble_is_captured_and_replayed_under_vmap(tmp_path: Path, same_minibatch: bool) -> None:
    """torch's model-ensembling recipe (functional_call + stack_module_state + vmap): the batched
    weights dropped the capture. Recorded stacked; an unbatched member computes other last bits,
    so replay runs vmap again (bit-exact), dropout drawing per member (randomness="different")."""
    import copy

    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.2),
                                  torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)) for _ in range(3)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    x = torch.randn(5, 16) if same_minibatch else torch.randn(3, 5, 16)

    def ensemble() -> None:
        vmap(lambda p, b, data: functional_call(base, (p, b), (data,)), in_dims=(0, 0, None if same_minibatch else 0),
             randomness="different")(params, buffers, x)
    saved = _capture_strictly(base, [".", "1", "4"], tmp_path / "repo", "ensemble", ensemble)
    capture = modulelens.load("ensemble", repo=tmp_path / "repo")
    [call] = capture.calls
    assert call.vmap is not None and call.vmap["size"] == 3 and call.vmap["randomness"] == "different"
    assert call.vmap["inputs"] == ([] if same_minibatch else ["[0][0]"]) and "0.weight" in call.vmap["state"]
    assert capture.state_dict()["0.weight"].shape == (3, 32, 16)  # the members' weights, stacked
    with pytest.raises(ToolError, match=r"ran inside torch\.func\.vmap"):
        modulelens.verify(capture, torch.nn.Linear, timing=None, store=False)
    results = replay_in_fresh_process(tmp_path / "repo", {v.name: v.ref for v in saved})
    assert {label: (r["status"], r["mode"]) for label, r in results.items()} == \
        dict.fromkeys(results, ("PASS", "bit-exact")), {label: r.get("report") for label, r in results.items()}


def test_numpy_observations_and_actions_are_recorded_and_replayed(tmp_path: Path) -> None:
    """numpy arrays and scalars were unrecorded markers: a stable-baselines3 policy's ``predict``
    (numpy observation in, numpy actions out) could not be replayed, and a constructor taking an
    array could not be rebuilt. Stored as tensors (any byte order, 0-d included), rebuilt as numpy,
    compared element by element; the array the call changed in place is recorded before and after."""
    import numpy as np
    from method_models import NumpyPolicy

    modulelens.track_init()
    policy = NumpyPolicy(bounds=np.array([2.0, 0.5], dtype=np.float32))  # rebuilt from this array
    observations = np.linspace(-3, 3, 12, dtype=np.float32).reshape(4, 3)
    repo = tmp_path / "repo"
    saved = _capture_strictly(policy, [":predict"], repo, "ppo", lambda: policy.predict(observations))
    observations[:] = 9.0  # the job's array goes on changing: the recording is a copy
    cap = modulelens.load(saved[0].ref, repo=repo)
    recorded = cap.calls[0].args[0]
    assert isinstance(recorded, np.ndarray) and recorded.dtype == np.float32
    assert np.array_equal(recorded, np.linspace(-3, 3, 12, dtype=np.float32).reshape(4, 3))  # as it came in
    actions, count = cap.calls[0].output
    assert isinstance(actions, np.ndarray) and actions.shape == (4, 2) and type(count) is np.int64 and count == 4
    results = replay_in_fresh_process(repo, {"ppo": saved[0].ref})
    assert results["ppo"]["status"] == "PASS" and results["ppo"]["mode"] == "bit-exact", results


@pytest.mark.parametrize("array", ["0-d", "big-endian", "fortran", "bool"])
def test_numpy_arrays_of_every_layout_round_trip(tmp_path: Path, array: str) -> None:
    import numpy as np

    value = {"0-d": np.array(2.5, dtype=np.float64), "big-endian": np.arange(6, dtype=">i4").reshape(2, 3),
             "fortran": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
             "bool": np.array([True, False, True])}[array]
    model = torch.nn.Identity()
    with modulelens.capture(model, [""], repo=tmp_path / "repo", name="id") as cap:
        model(value)
    [loaded] = modulelens.load(cap.saved[0].ref, repo=tmp_path / "repo").calls[0].args
    assert isinstance(loaded, np.ndarray) and loaded.shape == value.shape and np.array_equal(loaded, value)
    assert loaded.dtype == value.dtype.newbyteorder("=")


def test_a_numpy_array_that_no_tensor_holds_is_an_unrecorded_marker_naming_its_dtype(tmp_path: Path) -> None:
    import numpy as np

    model = torch.nn.Identity()
    with pytest.warns(modulelens.CaptureWarning, match=r"a numpy array of dtype <U5 \(only bool, integer, float and "
                                                       r"complex arrays are stored\)"):
        with modulelens.capture(model, [""], repo=tmp_path / "repo", name="id") as cap:
            model(np.array(["hello", "world"]))
    [loaded] = modulelens.load(cap.saved[0].ref, repo=tmp_path / "repo").calls[0].args
    assert isinstance(loaded, modulelens.Unrecorded)

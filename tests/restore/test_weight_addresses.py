"""A recorded tensor comes back at the address offset the job's had (format/tensors.py).

CPU kernels pick their vector loops by where the data starts: MKL's matrix-vector product (a
Linear with one output) rounds a weight that starts 4 bytes past a 64-byte boundary differently
from one on the boundary. transformers maps a checkpoint's safetensors weights at such addresses,
so sentence-transformers' CrossEncoder (a one-label head) replayed 1 ULP off with its weights
copied onto boundaries (the census found it). Each case is replayed in a fresh process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from child_process import replay_in_fresh_process

import modulelens
from modulelens.format.tensors import address_offset, at_address_offset

SUPPORT = Path(__file__).resolve().parents[1] / "support"
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat runs".split()]




def _capture(model: torch.nn.Module, repo: Path, name: str, job: Any) -> modulelens.VersionInfo:
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)  # nothing dropped, nothing unrecorded
        with modulelens.capture(model, ["."], repo=repo, name=name, record=modulelens.Recording(max_calls=1)) as cap:
            job()
    [saved] = cap.saved
    return saved


def _cross_encoder_folder(folder: Path) -> Path:
    """A tiny BERT with a one-label head saved as a user's own checkpoint (safetensors)."""
    import transformers

    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    config = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64, num_labels=1)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_a_cross_encoder_from_its_checkpoint_replays_bit_exact(tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    with modulelens.track_init():
        model = CrossEncoder(str(_cross_encoder_folder(tmp_path / "model")), device="cpu")
    head = model[0].model.classifier.weight
    pairs = [("the cat sat on the mat", "a dog runs"), ("the cat sat on the mat", "the mat")]
    saved = _capture(model, tmp_path / "repo", "cross", lambda: model.predict(pairs))
    capture = modulelens.load(saved.ref, repo=tmp_path / "repo")
    entry = capture.metadata["tensors"][capture.metadata["states"][0]["parameters"]["0.model.classifier.weight"]["tensor"]]
    assert entry.get("address_offset", 0) == address_offset(head)  # what the job's head weight had, recorded
    assert address_offset(capture.module[0].model.classifier.weight) == address_offset(head)
    results = replay_in_fresh_process(tmp_path / "repo", {"cross": saved.ref})
    assert results["cross"]["status"] == "PASS" and results["cross"]["differing"] == 0, results


def test_a_weight_off_a_boundary_is_loaded_at_the_same_offset(tmp_path: Path) -> None:
    model = torch.nn.Linear(16, 1)
    with torch.no_grad():
        model.weight.data = at_address_offset(model.weight.detach(), 8)  # as a mapped checkpoint places it
    x = torch.randn(2, 16)
    saved = _capture(model, tmp_path / "repo", "head", lambda: model(x))
    capture = modulelens.load(saved.ref, repo=tmp_path / "repo")
    assert address_offset(capture.module.weight) == 8
    assert address_offset(capture.module.bias) == 0  # an aligned tensor records nothing and comes back aligned
    [given] = capture.calls[0].args
    assert address_offset(given) == address_offset(x) == 0
    results = replay_in_fresh_process(tmp_path / "repo", {"head": saved.ref})
    assert results["head"]["status"] == "PASS" and results["head"]["differing"] == 0, results


def test_a_call_input_off_a_boundary_comes_back_at_its_offset(tmp_path: Path) -> None:
    model = torch.nn.Linear(16, 1)
    x = torch.randn(3, 17)[:, 1:]  # a slice: its data starts 4 bytes past the block's start
    saved = _capture(model, tmp_path / "repo", "sliced", lambda: model(x))
    capture = modulelens.load(saved.ref, repo=tmp_path / "repo")
    [given] = capture.calls[0].args
    assert torch.equal(given, x) and address_offset(given) == address_offset(x) != 0
    results = replay_in_fresh_process(tmp_path / "repo", {"sliced": saved.ref})
    assert results["sliced"]["status"] == "PASS", results


"""Plain library objects passed to a module's constructor are stored by their attributes
(format/library_object_codecs.py), so the module is rebuilt from its recorded arguments.

sentence-transformers' ``WordEmbeddings`` takes a ``WhitespaceTokenizer``, kornia's
``ApplyColorMap`` a ``ColorMap``: both modules were refused on load ("cannot store a value of
type ...") until these codecs (the census found them). Each is captured strictly (nothing
dropped or unrecorded) and replayed in a fresh process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from child_process import replay_in_fresh_process

import modulelens

SUPPORT = Path(__file__).resolve().parents[1] / "support"
WORDS = ["[PAD]", "the", "a", "cat", "dog", "sat", "on", "mat"]




def _capture_strictly(model: torch.nn.Module, repo: Path, name: str, job: Any) -> modulelens.VersionInfo:
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)  # nothing dropped, nothing unrecorded
        with modulelens.capture(model, ["."], repo=repo, name=name, strict=True) as cap:
            job()
    [saved] = cap.saved
    return saved


def test_word_embeddings_with_a_whitespace_tokenizer_is_rebuilt_from_its_arguments(tmp_path: Path) -> None:
    from sentence_transformers.sentence_transformer.modules.tokenizer import WhitespaceTokenizer
    from sentence_transformers.sentence_transformer.modules.word_embeddings import WordEmbeddings

    tokenizer = WhitespaceTokenizer(WORDS, stop_words=["a"], do_lower_case=True)
    with modulelens.track_init():
        model = WordEmbeddings(tokenizer, torch.randn(len(WORDS), 8))
    features = model.tokenize(["The cat sat on a mat", "the dog"])
    saved = _capture_strictly(model, tmp_path / "repo", "words", lambda: model(features))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rebuilt = modulelens.load(saved.ref, repo=tmp_path / "repo").module
    # its constructor's load_state_dict into the meta-built layer is a no-op the load must not print
    assert not [w for w in seen if "meta parameter" in str(w.message)], [str(w.message) for w in seen]
    assert torch.equal(rebuilt.emb_layer.weight, model.emb_layer.weight)
    assert type(rebuilt.tokenizer) is WhitespaceTokenizer
    assert vars(rebuilt.tokenizer) == vars(tokenizer)  # vocabulary, its index, stop words, lower-casing
    assert rebuilt.tokenize(["The cat sat on a mat"])["input_ids"].tolist() == \
        model.tokenize(["The cat sat on a mat"])["input_ids"].tolist()
    results = replay_in_fresh_process(tmp_path / "repo", {"words": saved.ref})
    assert results["words"]["status"] == "PASS" and results["words"]["differing"] == 0, results


def test_apply_color_map_is_rebuilt_from_its_color_map(tmp_path: Path) -> None:
    from kornia.color import ApplyColorMap, ColorMap

    colormap = ColorMap("viridis", num_colors=16)
    with modulelens.track_init():
        model = ApplyColorMap(colormap)
    image = torch.rand(2, 1, 8, 8)
    saved = _capture_strictly(model, tmp_path / "repo", "colors", lambda: model(image))
    rebuilt = modulelens.load(saved.ref, repo=tmp_path / "repo").module
    assert type(rebuilt.colormap) is ColorMap and rebuilt.colormap.name == "viridis"
    assert torch.equal(rebuilt.colormap.colors, colormap.colors)
    results = replay_in_fresh_process(tmp_path / "repo", {"colors": saved.ref})
    assert results["colors"]["status"] == "PASS" and results["colors"]["differing"] == 0, results


def test_torchrl_multi_agent_mlp_is_rebuilt_with_its_stacked_parameters(tmp_path: Path) -> None:
    """MultiAgentMLP stacks its agents' parameters into a TensorDict of nn.Parameters and hands it to
    TensorDictParams, which registers a parameter as a parameter and a plain tensor as a buffer."""
    from torchrl.modules import MultiAgentMLP

    with modulelens.track_init():
        model = MultiAgentMLP(n_agent_inputs=4, n_agent_outputs=2, n_agents=3, centralized=False, share_params=False,
                              depth=1, num_cells=8)
    observations = torch.randn(2, 3, 4)
    saved = _capture_strictly(model, tmp_path / "repo", "agents", lambda: model(observations))
    rebuilt = modulelens.load(saved.ref, repo=tmp_path / "repo").module
    assert [n for n, _ in rebuilt.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert not list(rebuilt.named_buffers())
    results = replay_in_fresh_process(tmp_path / "repo", {"agents": saved.ref})
    assert results["agents"]["status"] == "PASS" and results["agents"]["differing"] == 0, results


def test_tensordict_ensemble_module_is_rebuilt_from_its_tensordict(tmp_path: Path) -> None:
    from tensordict import TensorDict
    from tensordict.nn import EnsembleModule, TensorDictModule

    with modulelens.track_init():
        member = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["obs"], out_keys=["value"])
        model = EnsembleModule(member, num_copies=3)
    batch = TensorDict({"obs": torch.randn(5, 4)}, batch_size=[5])
    saved = _capture_strictly(model, tmp_path / "repo", "ensemble", lambda: model(batch))
    results = replay_in_fresh_process(tmp_path / "repo", {"ensemble": saved.ref})
    assert results["ensemble"]["status"] == "PASS" and results["ensemble"]["differing"] == 0, results

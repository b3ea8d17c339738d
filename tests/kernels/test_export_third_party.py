"""Kernel export of third-party modules captured with their library defaults (issue 23, defect 4).

transformers modules (a config object as the constructor argument, a cache among the call inputs,
``(output, None)`` results), timm blocks and the demo's modules: every capture exports, and the
problem reproduces the recorded output when run through KernelBench's evaluator contract
(``kernelbench_contract.py``, with ``ModelNew = Model``) -- except where the manifest says why
KernelBench cannot (several output tensors). The sweep over every transformers architecture is
``census_export.py`` (a script; its last numbers are in docs/kernels.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import census_export
import kernelbench_contract
import pytest
import torch

import modulelens
from modulelens.kernels.export import export_kernelbench


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "gpt2", "bert", "t5"])
def test_transformers_layers_export_and_reproduce_in_kernelbench(model_type: str, tmp_path: Path) -> None:
    """The first decoder layer, its MLP, attention and norms, captured in eval with caches on."""
    row = census_export.run_architecture(model_type, "eval", tmp_path)
    assert not row.get("skipped") and len(row["modules"]) >= 2, row
    for module in row["modules"]:
        assert module["exported"], module
        evaluation = module["evaluator"]
        if module["kernelbench_compatible"] or not any("returns" in r for r in module["reasons"]):
            assert evaluation["reproduces"], module
        else:  # several output tensors: KernelBench compares one, and the manifest says so
            assert evaluation["notes"] and not evaluation["reproduces"], module
    assert len(row["modules"]) == len(row["targets"]) == 3, row  # the layer, its MLP and its attention
    mlp = next(m for m in row["modules"] if m["ref"] == f"{model_type}/{row['targets'][1]}:v1")
    assert mlp["kernelbench_compatible"] and mlp["evaluator"]["reproduces"], mlp


def test_llama_in_training_mode_exports_with_its_config_as_source(tmp_path: Path) -> None:
    """Built from a config, a model is in training mode: the library default. Llama has no dropout,
    and attention's sdpa is not counted as random (its dropout_p is 0)."""
    row = census_export.run_architecture("llama", "train", tmp_path)
    assert all(m["exported"] and m["evaluator"]["reproduces"] for m in row["modules"]
               if not any("returns" in r for r in m["reasons"])), row
    problem = (tmp_path / "problems").glob("*layers.0.mlp*/problem.py")
    text = next(iter(problem)).read_text()
    assert ".LlamaConfig.from_dict({" in text and "hidden_size" in text
    assert not any("random ops" in r for m in row["modules"] for r in m["reasons"]), row


def test_decoder_layer_self_check_runs_in_its_own_process(tmp_path: Path) -> None:
    """The exporter's self-check (a child process) reproduces a decoder layer given a cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with modulelens.track_init():
        model = LlamaForCausalLM(config).eval()
    repo = str(tmp_path / "repo")
    with modulelens.capture(model, targets=["model.layers.0"], repo=repo, name="llama"), torch.no_grad():
        model(torch.randint(0, 64, (2, 8)))
    result = export_kernelbench("llama/model.layers.0", tmp_path / "p", repo=repo)
    m = result.manifest
    assert m["self_check"]["reproduces_recorded_outputs"] is True, m["self_check"]
    assert m["self_check"]["process"]["returncode"] == 0
    text = result.problem.read_text()
    assert "_ml_state(" in text and "copy.deepcopy(" in text  # the cache is rebuilt and copied per call
    assert "cache" in m["model"]["forward_arguments"]
    assert kernelbench_contract.evaluate(result.directory).reproduces_recorded


def _timm() -> Any:
    from timm_support import import_timm

    return import_timm()


@pytest.mark.parametrize(("name", "target", "size"), [("vit_tiny_patch16_224", "blocks.0", 64),
                                                      ("resnet10t", "layer1.0", 64),
                                                      ("convnext_atto", "stages.0.blocks.0", 64)])
def test_timm_blocks_export_and_reproduce(name: str, target: str, size: int, tmp_path: Path) -> None:
    timm = _timm()
    torch.manual_seed(0)
    kwargs = {"img_size": size} if name.startswith("vit") else {}
    with modulelens.track_init():
        model = timm.create_model(name, pretrained=False, **kwargs).eval()
    repo = str(tmp_path / "repo")
    with modulelens.capture(model, targets=[target], repo=repo, name=name), torch.no_grad():
        model(torch.randn(2, 3, size, size))
    result = export_kernelbench(f"{name}/{target}", tmp_path / "p", repo=repo, check=False)
    assert result.manifest["kernelbench_compatible"], result.manifest["kernelbench_incompatible_reasons"]
    evaluation = kernelbench_contract.evaluate(result.directory)
    assert evaluation.reproduces_recorded, evaluation


def test_demo_modules_export_and_reproduce(tmp_path: Path) -> None:
    """The demo's recommendation model, trained one step as its script does (training mode, dropout)."""
    from modulelens.demo.model import CARDINALITIES, RecModel, synthetic_batch

    torch.manual_seed(0)
    with modulelens.track_init():
        model = RecModel(CARDINALITIES)
    dense, sparse, labels = synthetic_batch(64, torch.Generator().manual_seed(0))
    repo = str(tmp_path / "repo")
    targets = ["bottom_mlp", "top_mlp", "attention", "interaction"]
    with modulelens.capture(model, targets=targets, repo=repo, name="demo"):
        torch.nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
    for target in targets:
        recorded = export_kernelbench(f"demo/{target}", tmp_path / target, repo=repo, check=False)
        evaluation = kernelbench_contract.evaluate(recorded.directory)
        if any("random ops" in r for r in recorded.manifest["kernelbench_incompatible_reasons"]):
            assert target in ("top_mlp", "attention")  # dropout 0.1: marked, and the eval export is the one to use
            recorded = export_kernelbench(f"demo/{target}", tmp_path / f"{target}-eval", repo=repo, check=False,
                                          mode="eval")
            evaluation = kernelbench_contract.evaluate(recorded.directory)
            assert evaluation.correctness, evaluation
            continue
        assert evaluation.reproduces_recorded, (target, evaluation, recorded.manifest["kernelbench_incompatible_reasons"])

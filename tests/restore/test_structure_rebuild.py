"""Modules whose structure changed after construction (issue 22, defect 2), captured at their
libraries' defaults and replayed in a fresh process: peft LoRA injected into a built Llama,
parametrizations, the hook-based and the parametrization norms, a ``torch.compile``d child, a child
replaced after construction, ``quantize_dynamic``, and torchtune's builders (module-valued
arguments, layers appended to an empty ``ModuleList``, cloned layers).

The capture worker and the replay worker are fresh processes with torchtune's own folder on their
path (scripts/_setup_env.sh); the scenarios are in tests/support/structure_models.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from child_process import PYTHON, REPO_ROOT, SUPPORT_DIR, subprocess_env
from torch import nn

import modulelens
from modulelens.errors import CorruptCaptureError, RestoreError

TORCHTUNE_PATH = f"{REPO_ROOT / '.venv' / 'torchtune-site'}:{SUPPORT_DIR / 'torchtune_shims'}"
PEFT = ["peft_lora.layer", "peft_lora.attention", "peft_lora.q_proj", "peft_lora.model"]
TORCH = ["parametrized", "parametrized.a", "hook_norms", "hook_norms.conv", "compiled_child", "replaced_child",
         "quantize_dynamic", "quantize_dynamic.a"]
TORCHTUNE = ["torchtune_llama3", "torchtune_llama3.layer", "torchtune_lora", "torchtune_lora.attn"]


def _worker(*args: str) -> str:
    env = subprocess_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{TORCHTUNE_PATH}"
    result = subprocess.run([PYTHON, *args], capture_output=True, text=True, env=env, timeout=600, cwd=SUPPORT_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("structure")
    scenarios = ["parametrized", "hook_norms", "compiled_child", "replaced_child", "quantize_dynamic", "peft_lora",
                 "torchtune_llama3", "torchtune_lora"]
    manifest = root / "manifest.json"
    manifest.write_text(_worker(str(SUPPORT_DIR / "structure_models.py"), str(root / "repo"), *scenarios))
    return json.loads(_worker(str(SUPPORT_DIR / "fidelity_replay.py"), str(root / "repo"), str(manifest)))["results"]


@pytest.mark.parametrize("label", [*TORCH, *PEFT, *TORCHTUNE])
def test_a_structure_changed_after_construction_replays_in_a_fresh_process(replayed: dict[str, Any], label: str) -> None:
    result = replayed[label]
    assert result["status"] == "PASS", result.get("error") or result["report"]
    if label != "compiled_child":
        assert result["mode"] == "bit-exact", result["report"]


def test_the_rebuild_says_what_it_put_back(replayed: dict[str, Any]) -> None:
    assert "rebuilt from the recorded submodules: self_attn.q_proj, self_attn.v_proj, mlp.down_proj" in \
        replayed["peft_lora.layer"]["report"]
    assert "a.weight parametrized, b.weight parametrized, conv.weight parametrized" in replayed["parametrized"]["report"]
    assert "conv.weight weight_norm, head.weight spectral_norm" in replayed["hook_norms"]["report"]
    assert "rebuilt from the recorded submodules: head, drop" in replayed["replaced_child"]["report"]
    # torchtune's llama3 builder appends its layers to an empty ModuleList after constructing it
    assert "rebuilt from the recorded submodules: layers.0, layers.1" in replayed["torchtune_llama3"]["report"]
    # inductor rounds differently from eager: said, and compared within tolerance
    assert "b ran torch.compile'd in the job and runs eagerly here" in replayed["compiled_child"]["report"]


class Scale(nn.Module):
    def __init__(self, factor: Any) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_piece_without_a_construction_record_fails_naming_it(repo: modulelens.Repo) -> None:
    model = Holder()
    model.lin = nn.Sequential(nn.Linear(4, 4), Scale(lambda v: v))  # a lambda has no encoding
    with modulelens.capture(model, targets=[""], repo=repo, name="holder") as cap:
        model(torch.randn(2, 4))
    # The root's own record is fine, and so is the injected Sequential's (its recorded arguments name a
    # child with a lambda argument, so it is recorded by its attributes, issue 34); the child is the piece
    # with no record (its lambda is an attribute too), and the load names it.
    with pytest.raises(RestoreError, match=r"cannot rebuild submodule 'lin.1' \(test_structure_rebuild:Scale\): "
                                           r".* no construction record \(tree\['lin.1'\].args\[0\]: <function"):
        _ = modulelens.load(cap.saved[0].ref, repo=repo).module


def test_a_capture_whose_tree_names_a_missing_construction_is_corrupt(repo: modulelens.Repo) -> None:
    model = Holder()
    with modulelens.capture(model, targets=[""], repo=repo, name="holder"):
        model(torch.randn(2, 4))
    meta_path = Path(repo.root) / "names" / "holder" / "versions" / "1" / "capture.json"
    meta = json.loads(meta_path.read_text())
    assert meta["format_version"] == 2 and meta["module"]["tree"]["lin"]["class"] == "torch.nn.modules.linear:Linear"
    meta["module"]["tree"]["lin"]["construction"] = "m99"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CorruptCaptureError, match=r"module.tree\['lin'\].construction: 'm99' does not exist"):
        modulelens.load("holder:v1", repo=repo)


class SharedTrunk(nn.Module):
    """One submodule with children of its own, reachable at two paths (a model and its sub-model
    built around the same encoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.view = nn.Module()
        self.view.trunk = self.trunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.view.trunk(self.trunk(x))


def test_a_submodule_shared_at_two_paths_keeps_its_children(repo: modulelens.Repo) -> None:
    # The recorded tree lists a shared module's children at its first path only; the rebuild took
    # them, at the second path, for children the job no longer had and removed them (found by the
    # census: torch_geometric's ARGVA).
    model = SharedTrunk()
    with modulelens.capture(model, targets=[""], repo=repo, name="shared", strict=True) as cap:
        model(torch.randn(2, 4))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert loaded.module.view.trunk is loaded.module.trunk and len(loaded.module.trunk) == 2
    assert loaded.replay().passed


def test_torch_geometric_argva_shares_its_encoder_with_its_vgae(repo: modulelens.Repo) -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    model = pyg.ARGVA(pyg.GCNConv(4, 4), nn.Linear(4, 1))  # ARGVA keeps VGAE(encoder): one GCNConv, two paths
    x, edge_index = torch.randn(6, 4), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    with modulelens.capture(model, targets=[""], repo=repo, name="argva", strict=True) as cap:
        model(x, edge_index)
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    result = loaded.replay()
    assert result.passed and result.mode == "bit-exact", str(result)
    assert loaded.module.VGAE.encoder is loaded.module.encoder
    assert sorted(loaded.module.state_dict()) == sorted(model.state_dict())


class GappedStack(nn.Module):
    """Layers paired with an optional step each, the last one ``None`` (transformers' Informer
    encoder: ``conv_layers = ModuleList([...] + [None])``, zipped with its layers in forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.steps = nn.ModuleList([nn.Tanh(), None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, step in zip(self.layers, self.steps, strict=False):  # as Informer: a short list drops a layer
            x = layer(x)
            x = step(x) if step is not None else x
        return x


def test_a_none_entry_of_a_module_list_is_kept(repo: modulelens.Repo) -> None:
    model = GappedStack()
    with modulelens.capture(model, targets=[""], repo=repo, name="gapped", strict=True) as cap:
        model(torch.randn(2, 4))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert len(loaded.module.steps) == 2 and loaded.module.steps[1] is None
    result = loaded.replay()
    assert result.passed and result.mode == "bit-exact", str(result)


class NamedBackbone(nn.Module):
    """A backbone passed in as ``nn.Sequential(OrderedDict(...))`` (timm's hybrid ViT embeddings):
    Sequential names its children only when given an OrderedDict, so a plain dict would not do."""

    def __init__(self, backbone: nn.Sequential) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def test_an_ordered_dict_argument_rebuilds_named_children(repo: modulelens.Repo) -> None:
    from collections import OrderedDict

    with modulelens.track_init():
        model = NamedBackbone(nn.Sequential(OrderedDict([("conv", nn.Linear(4, 8)), ("act", nn.GELU())])))
    with modulelens.capture(model, targets=[""], repo=repo, name="named", strict=True) as cap:
        model(torch.randn(2, 4))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert list(loaded.module.backbone._modules) == ["conv", "act"]
    result = loaded.replay()
    assert result.passed and result.mode == "bit-exact", str(result)

"""Modules whose structure people change after construction (issue 22, defect 2), each built and run
as its users do: peft LoRA injected into a built Llama, parametrizations, the hook-based and the
parametrization norms, a child replaced by its ``torch.compile`` wrapper or by another module,
``quantize_dynamic``, and torchtune's builders (module-valued arguments, cloned layers).

``python structure_models.py REPO SCENARIO...`` captures the scenarios into REPO and prints the
manifest ``{label: ref}`` (a fresh process: torchtune's own folder is on its path only there).
"""

from __future__ import annotations

import fnmatch
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize


class Symmetric(nn.Module):
    """A parametrization as torch's tutorial writes it."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.triu() + weight.triu(1).transpose(-1, -2)


class Net(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.head = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(torch.relu(self.b(self.a(x))))
        y = self.conv(y.unsqueeze(-1).expand(-1, -1, 4)).mean(-1)
        return self.head(y)


@dataclass
class Scenario:
    name: str
    build: Callable[[], nn.Module]
    targets: dict[str, str]  # label -> target pattern ("" is the model)
    drive: Callable[[nn.Module], Any]


def _drive_net(model: nn.Module) -> None:
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()


def _parametrized() -> nn.Module:
    model = Net()
    parametrize.register_parametrization(model.a, "weight", Symmetric())
    nn.utils.parametrizations.orthogonal(model.b)
    nn.utils.parametrizations.weight_norm(model.conv)
    return model


def _hook_norms() -> nn.Module:
    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        nn.utils.weight_norm(model.conv)
        nn.utils.spectral_norm(model.head)
    return model


def _compiled_child() -> nn.Module:
    model = Net()
    model.b = torch.compile(model.b, backend="eager")  # the root's state then has `b._orig_mod.` keys
    return model


def _replaced_child() -> nn.Module:
    model = Net()
    model.head = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))  # another head after construction
    del model.drop
    model.drop = nn.Identity()
    return model


def _quantized() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        return torch.ao.quantization.quantize_dynamic(Net().eval(), {nn.Linear}, dtype=torch.qint8)


def _drive_quantized(model: nn.Module) -> None:
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(4, 8))


def _llama_lora() -> nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                                               target_modules=["q_proj", "v_proj", "down_proj"]))


def _drive_llama(model: nn.Module) -> None:
    model.train()
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    model(input_ids=ids[:, :6], labels=ids[:, :6]).loss.backward()


def _torchtune_llama() -> nn.Module:
    from torchtune.models.llama3 import llama3

    return llama3(vocab_size=128, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64,
                  intermediate_dim=64)


def _torchtune_lora() -> nn.Module:
    from torchtune.models.llama3 import lora_llama3

    return lora_llama3(lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=True, vocab_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64, intermediate_dim=64, lora_rank=4,
                       lora_alpha=8.0, lora_dropout=0.1)


def _drive_tokens(model: nn.Module) -> None:
    model.train()
    for length in (10, 6):
        model(torch.randint(0, 128, (2, length))).sum().backward()


SCENARIOS = {s.name: s for s in [
    Scenario("parametrized", _parametrized, {"parametrized": "", "parametrized.a": "a"}, _drive_net),
    Scenario("hook_norms", _hook_norms, {"hook_norms": "", "hook_norms.conv": "conv"}, _drive_net),
    Scenario("compiled_child", _compiled_child, {"compiled_child": ""}, _drive_net),
    Scenario("replaced_child", _replaced_child, {"replaced_child": ""}, _drive_net),
    Scenario("quantize_dynamic", _quantized, {"quantize_dynamic": "", "quantize_dynamic.a": "a"}, _drive_quantized),
    Scenario("peft_lora", _llama_lora, {"peft_lora.layer": "*.layers.0", "peft_lora.attention": "*.layers.1.self_attn",
                                        "peft_lora.q_proj": "*.layers.0.self_attn.q_proj",
                                        "peft_lora.model": "base_model.model.model"}, _drive_llama),
    Scenario("torchtune_llama3", _torchtune_llama, {"torchtune_llama3": "", "torchtune_llama3.layer": "layers.1"},
             _drive_tokens),
    Scenario("torchtune_lora", _torchtune_lora, {"torchtune_lora": "", "torchtune_lora.attn": "layers.0.attn"},
             _drive_tokens),
]}


def capture(repo: str, names: list[str]) -> dict[str, str]:
    import modulelens

    refs: dict[str, str] = {}
    with modulelens.track_init():
        for name in names:
            scenario = SCENARIOS[name]
            torch.manual_seed(0)
            model = scenario.build()
            with modulelens.capture(model, targets=list(scenario.targets.values()), repo=repo, name=f"structure/{name}",
                                    record=modulelens.Recording(max_calls=2), strict=True) as cap:
                scenario.drive(model)
            prefix = f"structure/{name}"
            saved = {info.name.removeprefix(prefix).lstrip("/"): info.ref for info in cap.saved}
            for label, pattern in scenario.targets.items():
                [refs[label]] = [ref for qualified, ref in saved.items()
                                 if qualified == pattern or (pattern and fnmatch.fnmatchcase(qualified, pattern))]
    return refs


if __name__ == "__main__":
    import structure_models  # the classes by their importable path, not __main__'s

    print(json.dumps(structure_models.capture(sys.argv[1], sys.argv[2:])))

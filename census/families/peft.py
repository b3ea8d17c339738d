"""peft adapters on a tiny Llama: LoRA, IA3, LoHa, LoKr, AdaLoRA, OFT, prompt and prefix tuning.

Each adapter is applied with ``peft.get_peft_model`` to a 2-layer Llama built from a config, as
people fine-tune; the adapted model is then run like the transformers family runs a causal LM
(prefill and a cached decode step). Captured: the adapted model and, by rule, its first decoder
layer with that layer's attention and MLP (where the adapters were injected).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from census.families.transformers import _job
from census.targets import Sample, Target

LLAMA = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
ATTENTION = ["q_proj", "v_proj"]


def _configs() -> dict[str, Callable[[], Any]]:
    import peft

    return {
        "LoRA": lambda: peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=ATTENTION),
        "IA3": lambda: peft.IA3Config(task_type="CAUSAL_LM", target_modules=["k_proj", "v_proj", "down_proj"],
                                      feedforward_modules=["down_proj"]),
        "LoHa": lambda: peft.LoHaConfig(task_type="CAUSAL_LM", r=4, target_modules=ATTENTION),
        "LoKr": lambda: peft.LoKrConfig(task_type="CAUSAL_LM", r=4, target_modules=ATTENTION),
        "AdaLoRA": lambda: peft.AdaLoraConfig(task_type="CAUSAL_LM", init_r=4, target_r=2, total_step=10,
                                              target_modules=ATTENTION),
        "OFT": lambda: peft.OFTConfig(task_type="CAUSAL_LM", r=4, target_modules=ATTENTION),
        "PromptTuning": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
        "PrefixTuning": lambda: peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    }


ADAPTERS = ["LoRA", "IA3", "LoHa", "LoKr", "AdaLoRA", "OFT", "PromptTuning", "PrefixTuning"]


def _build(adapter: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import peft
        import transformers

        base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
        return peft.get_peft_model(base, _configs()[adapter]())
    return build


def targets(sample: Sample) -> list[Target]:
    return [Target(a, _build(a), _job, calls=2) for a in sample.pick(ADAPTERS, str, quick_count=2)]

"""Which submodules of a model are captured besides the root, chosen by rule, not by hand.

The first *repeated block* (the first ``ModuleList``/``Sequential`` holding at least two modules
of one class that have children of their own: a transformer's first decoder layer, a CNN's first
stage block), and inside it the first module named like attention and the first named like an MLP.
Only modules the job really calls are kept (``census.worker`` checks that with hooks).
"""

from __future__ import annotations

from torch import nn

_ATTENTION = ("attn", "attention")
_NOT_ATTENTION = ("norm", "ln", "dropout", "drop", "proj", "layer_norm")
_MLP_NAMES = {"mlp", "feed_forward", "feedforward", "ffn", "ff", "ffw", "fc", "intermediate", "moe",
              "block_sparse_moe", "mlp_block", "channel_mlp", "ffn_layer", "mixer_mlp"}
_MLP_CLASSES = ("mlp", "feedforward", "moe", "ffn")


def by_rule(model: nn.Module) -> dict[str, str]:
    """``{"model": "", "block": ..., "attention": ..., "mlp": ...}`` (absent keys: no such module)."""
    picks = {"model": ""}
    block = _first_block(model)
    if block is None:
        return picks
    picks["block"] = block
    inner = list(model.get_submodule(block).named_modules())[1:]
    for name, module in inner:
        last = name.rsplit(".", 1)[-1].lower()
        if "attention" not in picks and any(a in last for a in _ATTENTION) and not any(last.endswith(n) or
                                                                                       last.startswith(n)
                                                                                       for n in _NOT_ATTENTION):
            picks["attention"] = f"{block}.{name}"
        if "mlp" not in picks and (last in _MLP_NAMES or any(c in type(module).__name__.lower() for c in _MLP_CLASSES)):
            if list(module.children()):  # a lone Linear named fc is not an MLP
                picks["mlp"] = f"{block}.{name}"
    return picks


def _first_block(model: nn.Module) -> str | None:
    for name, module in model.named_modules():
        if not name or not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        if len(children) >= 2 and len({type(c) for _, c in children[:2]}) == 1 and list(children[0][1].children()):
            return f"{name}.{children[0][0]}"  # a Sequential subclass may name its children
    return None

"""Which aten ops a piece of PyTorch code runs: a ``TorchDispatchMode`` that counts them.

Used at run time, where static checks cannot see (``getattr(F, "lin" + "ear")``, ``exec``, a
lambda in a dict, ``torch.ops.aten.mm``, ``@``): the kernel candidate worker counts the *heavy*
ops (matmul, convolution, attention) a candidate's forward sends through PyTorch; the exporter and
the float64 oracle (:mod:`modulelens.restore.oracle`) find the random ops (dropout, ``bernoulli``)
a module runs. A dispatch mode sees
every op that reaches aten, on CPU and CUDA alike; a Triton or CUDA-source kernel launch does not
go through aten, so a candidate doing its own compute shows none of these.

The kernel candidate worker loads this file by path before any candidate code runs, so it imports
torch and the standard library only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten op names (overload dropped) that do the main compute of matmul / convolution / attention
# layers. Composite ops (linear, matmul, einsum, conv2d, scaled_dot_product_attention) decompose
# into these before the dispatch mode sees them; both are listed to be safe.
HEAVY_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot", "einsum",
    "tensordot", "_int_mm", "_scaled_mm", "_addmm_activation", "addr", "outer", "ger", "chain_matmul",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "cudnn_convolution", "cudnn_convolution_transpose", "mkldnn_convolution",
    "miopen_convolution", "_mps_convolution", "slow_conv2d_forward", "slow_conv3d_forward",
    "_slow_conv2d_forward", "thnn_conv2d", "slow_conv_transpose2d", "slow_conv_dilated2d",
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
    "_native_multi_head_attention", "_fused_sdp_choice",
})


def op_name(func: object) -> str:
    """``aten.addmm.default`` -> ``addmm``."""
    schema = getattr(func, "_schema", None)
    name = schema.name if schema is not None else str(func)
    return name.split("::")[-1].split(".")[0]


class OpCounter(TorchDispatchMode):
    """Counts every aten op run inside ``with OpCounter() as ops:`` by name; notes random ops.

    Example::

        with OpCounter() as ops:
            torch.nn.functional.linear(x, w)
        ops.heavy()        # {"addmm": 1} or {"mm": 1}
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._random: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = op_name(func)
        self.counts[name] += 1
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()) and name not in self._random:
            self._random.append(name)
        return func(*args, **(kwargs or {}))

    def heavy(self) -> dict[str, int]:
        """The heavy ops (:data:`HEAVY_OPS`) that ran, with their counts."""
        return {name: n for name, n in sorted(self.counts.items()) if name in HEAVY_OPS}

    def random_ops(self) -> list[str]:
        """Ops that draw random numbers (aten's ``nondeterministic_seeded`` tag: dropout, bernoulli, rand...)."""
        return list(self._random)

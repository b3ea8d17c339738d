"""torchrec's jagged tensors (``KeyedJaggedTensor``, ``JaggedTensor``, ``KeyedTensor``) as inputs
and outputs of recommendation modules, through torchrec's pure-Python pieces.

Native fbgemm does not load with torch 2.13 (see ``census/shims/torchrec``): the processes of
this family import torchrec through that shim, so ``torchrec.sparse.jagged_tensor`` is torchrec's
own code and its one needed operator comes from the fbgemm library file that loads. torchrec's
own ``EmbeddingBagCollection`` is tried too; it imports fbgemm's Python package, so it is
reported as not built with the import error. The modules below consume the jagged tensors the
way ``EmbeddingBagCollection`` does (per key: values and offsets into an ``nn.EmbeddingBag``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from census.targets import CannotBuildError, Job, Sample, Target

EXTRA_PATH = {"capture": ["census/shims"], "replay": ["census/shims"]}
KEYS = ["user", "item", "query"]


def _jagged():  # type: ignore[no-untyped-def]
    try:
        from torchrec.sparse import jagged_tensor
    except Exception as error:
        raise CannotBuildError(f"torchrec.sparse.jagged_tensor does not import: {type(error).__name__}: {error}") from error
    return jagged_tensor


class KJTPooledEmbeddings(nn.Module):
    """A KeyedJaggedTensor in, one pooled embedding per key (a dict) out, like an EmbeddingBagCollection."""

    def __init__(self, keys: list[str], rows: int, dim: int) -> None:
        super().__init__()
        self.keys = list(keys)
        self.tables = nn.ModuleDict({k: nn.EmbeddingBag(rows, dim, mode="sum") for k in keys})

    def forward(self, features):  # type: ignore[no-untyped-def]
        per_key = features.to_dict()
        return {k: self.tables[k](per_key[k].values(), per_key[k].offsets()[:-1]) for k in self.keys}


class KJTKeyedOutput(KJTPooledEmbeddings):
    """The same, returning torchrec's ``KeyedTensor`` (what EmbeddingBagCollection returns)."""

    def forward(self, features):  # type: ignore[no-untyped-def]
        pooled = super().forward(features)
        return _jagged().KeyedTensor.from_tensor_list(self.keys, [pooled[k] for k in self.keys])


class JaggedMeanPool(nn.Module):
    """A JaggedTensor of dense rows in, the mean over each sample's rows out."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, jagged):  # type: ignore[no-untyped-def]
        rows = self.proj(jagged.values())
        offsets = jagged.offsets()
        return torch.stack([rows[offsets[i]:offsets[i + 1]].mean(0) for i in range(len(offsets) - 1)])


def _kjt():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(12)
    lengths = torch.randint(0, 4, (len(KEYS) * 3,), generator=g)
    values = torch.randint(0, 20, (int(lengths.sum()),), generator=g)
    return _jagged().KeyedJaggedTensor.from_lengths_sync(keys=KEYS, values=values, lengths=lengths)


def _ebc() -> nn.Module:
    _jagged()
    try:
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
    except Exception as error:
        raise CannotBuildError(f"torchrec.modules.embedding_modules does not import without native fbgemm: "
                               f"{type(error).__name__}: {error}"[:400]) from error
    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=k, embedding_dim=8, num_embeddings=20,
                                                             feature_names=[k]) for k in KEYS])


def _kjt_job(model: nn.Module) -> Job:
    features = _kjt()
    return lambda m: m(features)


def _jagged_job(model: nn.Module) -> Job:
    g = torch.Generator().manual_seed(13)
    jagged = _jagged().JaggedTensor(values=torch.randn(7, 8, generator=g), lengths=torch.tensor([2, 4, 1]))
    return lambda m: m(jagged)


TARGETS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], Job]]] = {
    "KJTPooledEmbeddings": (lambda: (_jagged(), KJTPooledEmbeddings(KEYS, 20, 8))[1], _kjt_job),
    "KJTKeyedOutput": (lambda: (_jagged(), KJTKeyedOutput(KEYS, 20, 8))[1], _kjt_job),
    "JaggedMeanPool": (lambda: (_jagged(), JaggedMeanPool(8))[1], _jagged_job),
    "EmbeddingBagCollection": (_ebc, _kjt_job),
}


def targets(sample: Sample) -> list[Target]:
    names = sample.pick(list(TARGETS), str, quick_count=2)
    return [Target(n, TARGETS[n][0], TARGETS[n][1], submodules=lambda _m: {"model": ""}) for n in names]

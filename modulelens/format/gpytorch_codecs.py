"""Codecs for ``gpytorch`` values, installed lazily by :mod:`modulelens.format.values`.

A gpytorch model's call (``model(x)``, recorded through the target ``model:__call__``: gpytorch's
own ``__call__`` runs no forward hook) returns a ``MultivariateNormal`` whose covariance is a lazy
``LinearOperator``. It is stored as a state object (docs/codecs.md) of its mean and its dense
covariance matrix, so replay compares both element by element, and rebuilt as the same class over
those dense tensors: the recorded lazy operator's structure is not kept (what it computes is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modulelens.format.values import register_state_codec

CODEC_NAME = "gpytorch.MultivariateNormal"


def _parts(distribution: Any) -> dict[str, object]:
    parts = {"mean": distribution.mean, "covariance_matrix": distribution.covariance_matrix}
    if hasattr(distribution, "_interleaved"):  # MultitaskMultivariateNormal
        parts["interleaved"] = distribution._interleaved
    return parts


def _rebuild(cls: type, parts: Mapping[str, object]) -> object:
    from linear_operator import to_linear_operator

    extra = {"interleaved": parts["interleaved"]} if "interleaved" in parts else {}
    # as a (dense) linear operator, like the lazy one recorded: a plain tensor makes torch's own
    # MultivariateNormal factor it at once, and a kernel matrix without noise is not numerically
    # positive definite (the Cholesky factorization raised)
    return cls(parts["mean"], to_linear_operator(parts["covariance_matrix"]), **extra)


def install() -> None:
    from gpytorch.distributions import MultivariateNormal

    register_state_codec(MultivariateNormal, name=CODEC_NAME, attributes=_parts, rebuild=_rebuild)

"""The training loop, and the job that runs it: ``python -m ranker [--steps N] [--config FILE]``.

Runs as is on one process, and under ``torchrun`` (gloo, DistributedDataParallel) on several.
"""

from __future__ import annotations

import argparse
import os

import torch

from ranker.model import Ranker, build_model


def batches(steps: int, batch_size: int, vocab: int, fields: int, dense: int, seed: int = 0):
    """Synthetic clicks: ids per field, dense features and a label."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch_size, fields), generator=generator)
        features = torch.randn(batch_size, dense, generator=generator)
        label = (features[:, 0] > 0).float()
        yield ids, features, label


def train(model: torch.nn.Module, steps: int = 20, batch_size: int = 64, lr: float = 1e-3, seed: int = 0) -> float:
    """Train ``model`` on synthetic clicks; returns the last loss."""
    inner: Ranker = getattr(model, "module", model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for ids, features, label in batches(steps, batch_size, inner.embeddings.num_embeddings, 4, 8, seed):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, features), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())  # the number, not a scalar of the graph (torch warns on float() of one)


def read_config(path: str | None) -> dict[str, float]:
    """``key: value`` lines (a small YAML subset: numbers only)."""
    if path is None:
        return {}
    config = {}
    for line in open(path).read().splitlines():
        key, _, value = line.partition("#")[0].partition(":")
        if key.strip():
            config[key.strip()] = float(value)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a file of `key: value` lines: steps, batch_size, lr, seed")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    config = read_config(args.config)
    steps = args.steps if args.steps is not None else int(config.get("steps", 20))
    seed = args.seed if args.seed is not None else int(config.get("seed", 0))
    torch.manual_seed(seed)
    model: torch.nn.Module = build_model()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun
        torch.distributed.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    loss = train(model, steps=steps, batch_size=int(config.get("batch_size", 64)), lr=config.get("lr", 1e-3), seed=seed)
    print(f"trained {steps} steps, last loss {loss:.4f}", flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

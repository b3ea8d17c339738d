"""Train the demo model for a few steps. Knows nothing of modulelens: `modulelens demo` runs it
under `modulelens run`, exactly as a user's own training script would be run."""

from __future__ import annotations

import argparse
import time

import torch

from modulelens.demo.model import CARDINALITIES, RecModel, synthetic_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = RecModel(CARDINALITIES)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    step_times = []
    for step in range(args.steps):
        dense, sparse, labels = synthetic_batch(args.batch, generator)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(dense, sparse), labels)
        loss.backward()
        optimizer.step()
        step_times.append(time.perf_counter() - start)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}  {step_times[-1] * 1e3:.1f} ms/step", flush=True)
    print(f"trained {args.steps} steps; median step {sorted(step_times)[len(step_times) // 2] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()

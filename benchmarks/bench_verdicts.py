"""What verdicts in ULPs cost: comparing an output leaf, and running the float64 oracle.

    python benchmarks/bench_verdicts.py [--rounds 7] [--sizes 65536 1048576 4194304]

Comparing (issue 36, "Verdicts in ULPs"), per output size and dtype (float32, bfloat16), a
candidate that differs from the expected output by up to one ULP in a quarter of its elements, 1
thread, the contenders timed interleaved:
  * allclose:           torch.allclose with the per-dtype tolerances (the obvious alternative)
  * compare tolerance:  modulelens.restore.compare.compare with the same tolerances, which now also
                        reports each leaf's error in ULPs (max_ulps)
  * compare ulps:       compare(..., ulps=2): the ULP tolerance
  * compare oracle:     compare(..., oracle=...): the oracle rule against a float64 oracle given
  * compare exact:      compare(exact=True) on a bit-identical output (replay's path when nothing changed)

The oracle's own run: a float64 copy of transformers' GPT2Block (default GPT2Config, eval mode) on
1 x 128 tokens against the block's float32 forward (Float64Oracle.run vs block(x)); and the copy
itself (copy.deepcopy + .to(float64), once per recorded state).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, median, report, timed

from modulelens.restore.compare import compare, default_tolerance
from modulelens.restore.oracle import Float64Oracle, OracleRun


def _leaves(size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    oracle = torch.randn(size, generator=generator, dtype=torch.float64)
    expected = oracle.to(dtype)
    moved = torch.nextafter(expected, torch.full_like(expected, float("inf")))
    candidate = torch.where(torch.rand(size, generator=generator) < 0.25, moved, expected)
    return expected, candidate, oracle


def comparing(sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        rtol, atol = default_tolerance(dtype) or (0.0, 0.0)
        for size in sizes:
            expected, candidate, oracle = _leaves(size, dtype)
            identical = expected.clone()
            run = OracleRun(outputs=oracle)
            contenders = {
                "allclose": lambda e=expected, c=candidate, r=rtol, a=atol: torch.allclose(c, e, rtol=r, atol=a),
                "compare tolerance": lambda e=expected, c=candidate: compare(e, c, exact=False),
                "compare ulps": lambda e=expected, c=candidate: compare(e, c, exact=False, ulps=2),
                "compare oracle": lambda e=expected, c=candidate, r=run: compare(e, c, exact=False, oracle=r),
                "compare exact": lambda e=expected, i=identical: compare(e, i, exact=True),
            }
            times = interleaved(contenders, rounds)
            base = median(times["allclose"])
            for label, samples in times.items():
                rows.append({"dtype": str(dtype).removeprefix("torch."), "elements": size, "contender": label,
                             "median_ms": median(samples) * 1e3, "vs_allclose": median(samples) / base})
    return rows


def oracle_run(rounds: int, tokens: int) -> list[dict[str, Any]]:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    block = GPT2Block(GPT2Config(), layer_idx=0).eval()
    x = torch.randn(1, tokens, 768)
    copies = timed(lambda: Float64Oracle(block), max(2, rounds // 2))
    oracle = Float64Oracle(block)

    def forward() -> None:
        with torch.no_grad():
            block(x)

    times = interleaved({"block float32": forward, "oracle float64": lambda: oracle.run((x,), {})}, rounds)
    base = median(times["block float32"])
    rows = [{"contender": label, "median_ms": median(samples) * 1e3, "vs_forward": median(samples) / base}
            for label, samples in times.items()]
    rows.append({"contender": "float64 copy (once per state)", "median_ms": median(copies) * 1e3,
                 "vs_forward": median(copies) / base})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1 << 16, 1 << 20, 1 << 22])
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = comparing(args.sizes, args.rounds)
    report("verdicts", "comparing one output leaf (1 thread)", rows,
           ["dtype", "elements", "contender", "median_ms", "vs_allclose"], {"rounds": args.rounds})
    rows = oracle_run(args.rounds, args.tokens)
    report("verdicts_oracle", f"the float64 oracle of a GPT-2-small block, 1 x {args.tokens} tokens (1 thread)", rows,
           ["contender", "median_ms", "vs_forward"], {"rounds": args.rounds, "tokens": args.tokens})


if __name__ == "__main__":
    main()

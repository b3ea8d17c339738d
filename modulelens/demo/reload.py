"""Second half of the demo, run in a fresh process: load one capture, replay it, say where it lives."""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from modulelens.repo import Repo
from modulelens.restore.loader import load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ref")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--result", help="write a JSON summary here")
    args = parser.parse_args()
    console = Console()

    start = time.perf_counter()
    capture = load(args.ref, repo=Repo(args.repo, create=False))
    module = capture.module
    load_seconds = time.perf_counter() - start
    n_params = sum(p.numel() for p in module.parameters())
    console.print(f"[bold]fresh process[/bold]: loaded {capture.ref} -> {type(module).__name__} "
                  f"({n_params:,} parameters) in {load_seconds * 1e3:.1f} ms")
    call = capture.calls[0]
    shapes = [tuple(a.shape) for a in call.args if hasattr(a, "shape")]
    console.print(f"recorded calls: {len(capture.calls)}; first call inputs {shapes}, "
                  f"training={call.training}, grad={call.grad_enabled}")
    report = capture.replay()
    table = Table(title=f"replay of {capture.ref} ({report.mode})")
    for col in ("call", "result", "max abs err", "output leaves"):
        table.add_column(col)
    for c in report.calls:
        table.add_row(str(c.index), "[green]bit-exact[/green]" if c.passed else f"[red]FAIL[/red] {c.error or ''}",
                      f"{max((leaf.max_abs_error for leaf in c.leaves), default=0):.3g}", str(len(c.leaves)))
    console.print(table)
    console.print(f"stored at {capture.repo.root} (version folder {capture.repo.version_path(capture.name, capture.version)})")
    if args.result:
        with open(args.result, "w") as handle:
            json.dump({"ref": capture.ref, "load_seconds": load_seconds, "parameters": n_params,
                       "replay": report.to_dict()}, handle)
    raise SystemExit(0 if report.passed else 1)


if __name__ == "__main__":
    main()

"""``python -m stress [--quick] [--write-docs]``: run the stress suite and print its table.

Full run: about 10 minutes on 2 cores. ``--quick`` (the CI subset, about 3 minutes) runs fewer
trials of each row. ``--write-docs`` puts the table into docs/reliability.md. Exits 1 when any
row has a loss, a wrong result, executed code, or an attempt that did not survive.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from stress.fuzz import fuzz_rows
from stress.hostile import hostile_capture_row, hostile_repo_row
from stress.hostile_export import hostile_export_row
from stress.hostile_index import forged_heads_row, index_lies_row
from stress.hostile_repo2 import hostile_repo2_rows
from stress.hostile_terminal import hostile_terminal_row
from stress.hostile_trust import hostile_trust_row
from stress.hostile_ui import hostile_ui_row
from stress.oversized import gigantic_shapes_row, junk_names_row, oversized_row
from stress.repo_ops import kill_row, race_row, rm_race_row
from stress.storage import storage_row
from stress.stuck_locks import stuck_locks_row
from stress.table import Row, render
from stress.ui_rows import ui_errors_row, ui_links_row, ui_sizes_row, ui_token_row
from stress.verdict_rows import export_forward_row, vacuous_verdict_row

DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
BEGIN, END = "<!-- stress table: begin -->", "<!-- stress table: end -->"


def run(quick: bool, seed: int) -> list[Row]:
    random.seed(seed)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    tmp = Path(tempfile.mkdtemp(prefix="modulelens-stress-"))
    rows = [
        kill_row(tmp, 10 if quick else 100),
        race_row(tmp, 4 if quick else 8, 5 if quick else 25),
        rm_race_row(tmp, 10 if quick else 120),
        *fuzz_rows(tmp, 500 if quick else 5000, 60 if quick else 500, seed),
        hostile_capture_row(tmp),
        hostile_repo_row(tmp),
        *hostile_repo2_rows(tmp),
        hostile_trust_row(tmp),
        hostile_ui_row(tmp, quick),
        ui_links_row(tmp),
        ui_errors_row(tmp),
        ui_sizes_row(tmp),
        ui_token_row(tmp),
        vacuous_verdict_row(tmp, quick),
        export_forward_row(tmp),
        hostile_terminal_row(tmp, colour=not quick),
        hostile_export_row(tmp, payload_count=1 if quick else None),
        storage_row(tmp, ("disk full", "permission denied"), ("api",)) if quick else storage_row(tmp),
        index_lies_row(tmp),
        forged_heads_row(tmp),
        stuck_locks_row(tmp, quick),
        oversized_row(tmp),
        junk_names_row(tmp, 20_000 if quick else 100_000),
        gigantic_shapes_row(tmp),
    ]
    return rows


def write_docs(table: str, quick: bool) -> None:
    text = DOC.read_text()
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    block = f"{BEGIN}\n{'CI subset (`--quick`)' if quick else 'Full run'}, {stamp}:\n\n{table}\n{END}"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + block + tail)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stress", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the CI subset (about 3 minutes)")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/reliability.md")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    rows = run(args.quick, args.seed)
    table = render(rows)
    print(table)
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.write_docs:
        write_docs(table, args.quick)
    sys.exit(0 if all(r.clean for r in rows) else 1)


if __name__ == "__main__":
    main()

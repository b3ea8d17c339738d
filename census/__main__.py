"""``python -m census [--quick] [--family transformers,...] [--write-docs]``: run the fidelity census.

Prints the table (per family: targets tried, built, captured, bit-exact) and every failure with its
category, and writes every outcome to ``census/results/<quick|full>.json``. ``--write-docs`` puts
the table and the failure list into docs/fidelity.md. Exits 1 when a capture was dropped, a job
broke under capture or a replay gave a wrong value (``census.known.NEVER_ACCEPTED``) and that
failure is not documented in ``census/known.py`` (the other categories are reported, not fatal).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from census import outcomes as oc
from census.run import Options, run

FAMILIES = ["torch_nn", "transformers", "timm", "torch_geometric", "diffusers", "peft", "torchrec"]
# The whole census in CI samples the two largest registries (fixed seed, docs/fidelity.md says so):
# every architecture of each takes about 40 minutes more on 2 cores.
FULL_LIMITS = {"transformers": 0, "timm": 0}
DOC = Path(__file__).resolve().parent.parent / "docs" / "fidelity.md"
RESULTS = Path(__file__).resolve().parent / "results"
BEGIN, END = "<!-- census table: begin -->", "<!-- census table: end -->"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "timm", "torch_geometric", "diffusers", "peft", "torchrec", "fbgemm_gpu_cpu"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def write_docs(table: str, failures: str, header: str) -> None:
    text = DOC.read_text()
    block = f"{BEGIN}\n{header}\n\n{table}\n\nEvery failure (category, then the first line of its message):\n\n{failures or '(none)'}\n{END}"
    head, found, rest = text.partition(BEGIN)
    if not found:
        raise SystemExit(f"{DOC} has no {BEGIN} marker")
    _, _, tail = rest.partition(END)
    DOC.write_text(head + block + tail)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m census", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seeded targets per family (every test run)")
    parser.add_argument("--family", default=",".join(FAMILIES), help=f"comma-separated, of {','.join(FAMILIES)}")
    parser.add_argument("--only", default="", help="comma-separated target names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="no sampling of the large registries in a full run")
    parser.add_argument("--nice", type=int, default=0, help="run the workers under nice -n N")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/fidelity.md")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default census/results/<quick|full>.json)")
    args = parser.parse_args()
    families = [f for f in args.family.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {FAMILIES}")
    limits = () if args.quick or args.all else tuple((f, n) for f, n in FULL_LIMITS.items() if n)
    options = Options(quick=args.quick, seed=args.seed, limits=limits, nice=args.nice,
                      only=tuple(filter(None, args.only.split(","))))
    start = time.perf_counter()
    outcomes, seconds = run(families, options)
    wall = time.perf_counter() - start
    table = oc.render(oc.rows(outcomes, seconds))
    failures = oc.render_failures(outcomes)
    kind = "quick" if args.quick else "full"
    sampled = ", ".join(f"{f}: a seeded sample of {n}" for f, n in limits) or "no sampling"
    header = (f"{'Quick sample (`--quick`)' if args.quick else 'Whole census'} ({sampled}; seed {args.seed}), "
              f"{time.strftime('%Y-%m-%d', time.gmtime())}, {wall / 60:.1f} min wall on {os.cpu_count()} cores, "
              + ", ".join(f"{k} {v}" for k, v in _versions().items()))
    print(header + "\n\n" + table + "\n\n" + (failures or "no failures"))
    out = args.out or RESULTS / f"{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"kind": kind, "seed": args.seed, "families": families, "sampled": dict(limits),
                               "wall_seconds": round(wall, 1), "family_seconds": seconds, "versions": _versions(),
                               "python": platform.python_version(),
                               "outcomes": [o.to_json() for o in outcomes]}, indent=1) + "\n")
    print(f"\n{len(outcomes)} outcomes in {out}; {wall:.0f} s", file=sys.stderr)
    if args.write_docs:
        write_docs(table, failures, header)
    from census.known import NEVER_ACCEPTED

    fatal = [o for o in outcomes if o.category.startswith(NEVER_ACCEPTED) and not o.known]
    sys.exit(1 if fatal else 0)


if __name__ == "__main__":
    main()

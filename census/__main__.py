"""``python -m census [--quick] [--family transformers,...] [--write-docs]``: run the fidelity census.

Prints the table (per family: targets tried, built, captured, bit-exact) and every failure with its
category, and writes every outcome to ``census/results/<quick|full>.json``. ``--write-docs`` puts
the table and the failure list into docs/fidelity.md. Exits 1 when a target fails in a way
``census/known.py`` does not document (a wrong value is never accepted), or when a defect entry
there matched nothing in a whole census (fixed: remove it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from census import known
from census import outcomes as oc
from census.run import CPU, Options, run

# the slowest first, so that with --jobs 2 the short ones fill the other core
FAMILIES = ["transformers", "timm", "torch_geometric", "kornia", "monai", "torch_nn", "tools", "diffusers", "torchdiffeq",
            "peft", "torchrl", "sentence_transformers", "torchaudio", "e3nn", "torchrec", "neuralop", "x_transformers",
            "vector_quantize", "normflows", "methods"]
# The whole census (CI) runs every target of every family: 36.5 CPU minutes measured (full.json's
# family_cpu_seconds, docs/fidelity.md; the eleven library families beyond the registries about 5.5 of them),
# so about 18 minutes on CI's 2 free cores. --limit style sampling stays available: FAMILY -> a seeded sample
# of N targets.
FULL_LIMITS: dict[str, int] = {}
DOC = Path(__file__).resolve().parent.parent / "docs" / "fidelity.md"
RESULTS = Path(__file__).resolve().parent / "results"
BEGIN, END = "<!-- census table: begin -->", "<!-- census table: end -->"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "timm", "torch_geometric", "diffusers", "peft", "torchrec", "fbgemm_gpu_cpu",
                 "kornia", "monai", "e3nn", "torchdiffeq", "neuraloperator", "normflows", "vector_quantize_pytorch",
                 "x_transformers", "einops", "sentence_transformers", "torchrl", "tensordict", "gpytorch", "torchsde",
                 "rotary-embedding-torch", "accelerate", "torchmetrics"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def write_docs(table: str, failures: str, header: str) -> None:
    text = DOC.read_text()
    listing = failures or "(none)"
    block = (f"{BEGIN}\n{header}\n\n{table}\n\nEvery failure (category, then the first line of its message):\n\n"
             f"{listing}\n{END}")
    head, found, rest = text.partition(BEGIN)
    if not found:
        raise SystemExit(f"{DOC} has no {BEGIN} marker")
    _, _, tail = rest.partition(END)
    DOC.write_text(head + block + tail)


def _merge(runs: list[dict]) -> tuple[list[oc.Outcome], dict[str, float], dict[str, float], list[str]]:
    """Earlier runs' JSON as one census, in order: a later run of a whole family replaces that
    family; a later run of named targets (``--only``) replaces those targets' outcomes, and its wall
    and CPU seconds add to the family's (the work the census took)."""
    kept: dict[tuple[str, str], list[dict]] = {}
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for r in runs:
        ran = [f for f in r["families"] if r["family_seconds"].get(f)]
        for family in ran:
            wall_s, cpu_s = r["family_seconds"][family], r.get("family_cpu_seconds", {}).get(family, 0.0)
            if r.get("only"):
                seconds[family], cpu[family] = seconds.get(family, 0.0) + wall_s, cpu.get(family, 0.0) + cpu_s
            else:
                kept = {key: found for key, found in kept.items() if key[0] != family}
                seconds[family], cpu[family] = wall_s, cpu_s
        fresh: dict[tuple[str, str], list[dict]] = {}
        for o in r["outcomes"]:
            if o["family"] in ran:
                fresh.setdefault((o["family"], o["target"]), []).append(o)
        kept.update(fresh)
    outcomes = known.annotate([oc.Outcome(**o) for found in kept.values() for o in found])
    return outcomes, {f: round(v, 1) for f, v in seconds.items()}, {f: round(v, 1) for f, v in cpu.items()}, \
        list(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m census", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seeded targets per family (every test run)")
    parser.add_argument("--family", default=",".join(FAMILIES), help=f"comma-separated, of {','.join(FAMILIES)}")
    parser.add_argument("--only", default="", help="comma-separated target names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="no sampling of the large registries in a full run")
    parser.add_argument("--probe-only", action="store_true",
                        help="build and run every target without modulelens, capture nothing (the build rate)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="families run at a time (default: cores)")
    parser.add_argument("--nice", type=int, default=0, help="run the workers under nice -n N")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/fidelity.md")
    parser.add_argument("--work", type=Path, default=None, help="keep the worker logs in this folder")
    parser.add_argument("--keep-repos", action="store_true", help="keep the captures (in --work) after their replay")
    parser.add_argument("--from-json", type=Path, action="append", default=[],
                        help="no run: the table of earlier runs' JSON (several: merged, e.g. a family rerun alone), "
                             "failures matched against census/known.py as it is now")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default census/results/<quick|full>.json)")
    args = parser.parse_args()
    families = [f for f in args.family.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {FAMILIES}")
    limits = () if args.quick or args.all or args.only else tuple((f, n) for f, n in FULL_LIMITS.items() if n)
    options = Options(quick=args.quick, seed=args.seed, limits=limits, nice=args.nice,
                      only=tuple(filter(None, args.only.split(","))), probe_only=args.probe_only,
                      keep_repos=args.keep_repos)
    start = time.perf_counter()
    if args.from_json:
        runs = [json.loads(path.read_text()) for path in args.from_json]
        outcomes, seconds, cpu, families = _merge(runs)
        load = runs[0].get("load_average", [])
        wall = sum(r["wall_seconds"] for r in runs)
        args.quick = runs[0]["kind"].endswith("quick")
        limits = tuple({k: v for r in runs for k, v in r["sampled"].items()}.items())
        args.out = args.out or args.from_json[0]
    else:
        load = [round(x, 1) for x in os.getloadavg()]  # how shared the cores were when it started
        with tempfile.TemporaryDirectory(prefix="modulelens-census-") as scratch:
            work = args.work or Path(scratch)  # the repos and the workers' logs; kept only with --work
            outcomes, seconds = run(families, options, work, jobs=args.jobs)
        wall, cpu = time.perf_counter() - start, {f: round(c, 1) for f, c in CPU.items()}
    table = oc.render(oc.rows(outcomes, seconds, cpu), wall)
    failures = oc.render_failures(outcomes)
    kind = ("probe-" if args.probe_only else "") + ("quick" if args.quick else "full")
    sampled = ", ".join(f"{f}: a seeded sample of {n}" for f, n in limits) or "no sampling"
    summed = f" summed over {len(args.from_json)} runs" if len(args.from_json) > 1 else ""
    header = (f"{'Quick sample (`--quick`)' if args.quick else 'Whole census'} ({sampled}; seed {args.seed}), "
              f"{time.strftime('%Y-%m-%d', time.gmtime())}, {wall / 60:.1f} min wall{summed} on {os.cpu_count()} cores "
              f"(load average {load[0] if load else '?'} at the start), {sum(cpu.values()) / 60:.1f} min of CPU, "
              + ", ".join(f"{k} {v}" for k, v in _versions().items()))
    print(header + "\n\n" + table + "\n\n" + (failures or "no failures"))
    out = args.out or RESULTS / f"{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"kind": kind, "seed": args.seed, "families": families, "sampled": dict(limits),
                               "only": [] if args.from_json else list(options.only),
                               "wall_seconds": round(wall, 1), "family_seconds": seconds,
                               "family_cpu_seconds": cpu, "load_average": load, "versions": _versions(),
                               "python": platform.python_version(),
                               "outcomes": [o.to_json() for o in outcomes]}, indent=1) + "\n")
    print(f"\n{len(outcomes)} outcomes in {out}; {wall:.0f} s", file=sys.stderr)
    if args.write_docs:
        write_docs(table, failures, header)
    fatal = [o for o in outcomes if not known.accepted(o)]
    for o in fatal:
        print(f"census: not accepted: {o.family} {o.label or o.target}: {o.category}", file=sys.stderr)
    old = [] if args.quick or args.only else known.stale(outcomes, families)
    for entry in old:
        print(f"census: stale entry in census/known.py (fixed? remove it): {entry}", file=sys.stderr)
    sys.exit(1 if fatal or old else 0)


if __name__ == "__main__":
    main()

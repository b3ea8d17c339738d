"""How fast the CLI starts (issue 14): fresh-process wall time of the commands people type most.

    python benchmarks/bench_cli.py [--rounds 9] [--versions 200] [--names 20]

Each round runs, in a new process and in rotating order: ``python -c pass`` (the interpreter),
``python -c "import typer"`` (the CLI framework), ``python -c "import torch"`` (what a command
that loads a capture pays first), and ``modulelens --help``, ``--version``, ``ls`` and ``show``
on a repo of --versions versions under --names names (stdout to a pipe, as a script or an agent
reads it). Reports the median and best of the rounds, each command's ratio to the interpreter and
to ``import torch``, and the machine's load average (other processes share its cores); results go
to benchmarks/results/cli.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import fresh_process_env, many_versions_repo, median, report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--versions", type=int, default=200)
    parser.add_argument("--names", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ml-bench-cli-"))
    try:
        root = work / "repo"
        many_versions_repo(root, args.versions, args.names)
        ref = f"team/model{args.names // 2}/block"
        cli = [sys.executable, "-m", "modulelens"]
        contenders = {
            "python -c pass": [sys.executable, "-c", "pass"],
            'python -c "import typer"': [sys.executable, "-c", "import typer"],
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "modulelens --help": [*cli, "--help"],
            "modulelens --version": [*cli, "--version"],
            f"modulelens ls ({args.versions} versions)": [*cli, "ls", "--repo", str(root)],
            "modulelens show": [*cli, "show", ref, "--repo", str(root)],
        }
        load_before = os.getloadavg()
        times = _interleaved(contenders, args.rounds)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = {label: median(samples) for label, samples in times.items()}
    floor, torch_s = m["python -c pass"], m['python -c "import torch"']
    rows = [{"command": label, "median_s": m[label], "best_s": min(samples), "vs_python": m[label] / floor,
             "vs_import_torch": m[label] / torch_s, "rounds": len(samples)} for label, samples in times.items()]
    report("cli", f"fresh-process CLI start (median of {args.rounds} interleaved rounds; "
                  f"load average {load_before[0]:.1f} -> {load_after[0]:.1f})",
           rows, ["command", "median_s", "best_s", "vs_python", "vs_import_torch", "rounds"],
           {"rounds": args.rounds, "versions": args.versions, "names": args.names,
            "load_average": {"before": load_before, "after": load_after}})


def _interleaved(contenders: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    """Run each command once per round (stdout to a pipe), rotating the order every round."""
    labels = list(contenders)
    times: dict[str, list[float]] = {label: [] for label in labels}
    env = fresh_process_env(OMP_NUM_THREADS="1")
    for label in labels:  # untimed: writes the bytecode cache, as a pip install has (fresh_process_env)
        subprocess.run(contenders[label], check=True, stdout=subprocess.PIPE, env=env)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            start = time.perf_counter()
            subprocess.run(contenders[label], check=True, stdout=subprocess.PIPE, env=env)
            times[label].append(time.perf_counter() - start)
    return times


if __name__ == "__main__":
    main()

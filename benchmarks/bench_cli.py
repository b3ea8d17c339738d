"""How fast the CLI starts (issues 14, 37): fresh-process wall time of the commands people type most.

    python benchmarks/bench_cli.py [--rounds 9] [--versions 200] [--names 20] [--baseline DIR] [--no-wheel]

Each round runs, in a new process and in rotating order: ``python -c pass`` (the interpreter),
``python -c "import typer"`` (the CLI framework), ``python -c "import torch"`` (what a command
that loads a capture pays first), plain Python printing the index (the floor of ``ls``: read each
name's index head and log with ``json``, print one line per live version; no modulelens), and
``modulelens --help``, ``--version``, ``ls`` and ``show`` on a repo of --versions versions under
--names names (stdout to a pipe, as a script or an agent reads it). Reports the median and best of
the rounds, each command's ratio to the interpreter, to printing the index (issue 37's target:
``ls`` and ``show`` within 1.5x of it) and to ``import torch``, and the machine's load average
(other processes share its cores); results go to benchmarks/results/cli.json.

Which installation: ``python -m modulelens`` and the console script ``modulelens`` of this
environment, where a development checkout is installed editable (its import finder, loaded at every
interpreter start, imports pathlib: ~9 ms that ``python -c pass`` and the floor pay too); and,
unless ``--no-wheel``, a wheel of this checkout installed as users get it (``pip wheel`` then
``pip install --no-deps`` into a new virtual environment, its dependencies read from this one's
site-packages by ``PYTHONPATH``), timed beside its own ``python -c pass`` and floor: rows ``wheel:
...``, whose ``vs_same_floor`` is their ratio to the wheel's floor (the other rows': to this
environment's floor).

``--baseline DIR``: also time ``ls`` and ``show`` of the modulelens package in DIR (another
checkout's root, e.g. ``git archive OLD modulelens | tar -x -C DIR``), in the same rounds; DIR
goes first on the path (PYTHONPATH, the commands run outside the checkout), and this checkout's
``ls`` and ``show`` are timed the same way beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
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
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout root whose modulelens is timed beside this one's")
    parser.add_argument("--no-wheel", action="store_true", help="skip the rows of an installed wheel")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ml-bench-cli-"))
    try:
        root = work / "repo"
        many_versions_repo(root, args.versions, args.names)
        ref = f"team/model{args.names // 2}/block"
        cli = [sys.executable, "-m", "modulelens"]
        script = Path(sys.executable).parent / "modulelens"  # what `pip install` put on PATH
        contenders: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], {}),
            'python -c "import typer"': ([sys.executable, "-c", "import typer"], {}),
            'python -c "import torch"': ([sys.executable, "-c", "import torch"], {}),
            PRINT_INDEX: ([sys.executable, "-c", _PRINT_INDEX_SCRIPT, str(root)], {}),
            "modulelens --help": ([*cli, "--help"], {}),
            "modulelens --version": ([*cli, "--version"], {}),
            f"modulelens ls ({args.versions} versions)": ([*cli, "ls", "--repo", str(root)], {}),
            "modulelens show": ([*cli, "show", ref, "--repo", str(root)], {}),
            "console script: modulelens ls": ([str(script), "ls", "--repo", str(root)], {}),
            "console script: modulelens show": ([str(script), "show", ref, "--repo", str(root)], {}),
        }
        if not args.no_wheel:
            contenders |= _wheel_contenders(work, root, ref)
        for label, checkout in (("this checkout", Path(__file__).resolve().parents[1]), ("baseline", args.baseline)):
            if args.baseline is not None:  # both by PYTHONPATH, so that they are found the same way
                path = {"PYTHONPATH": str(checkout)}
                contenders[f"modulelens ls ({label})"] = ([*cli, "ls", "--repo", str(root)], path)
                contenders[f"modulelens show ({label})"] = ([*cli, "show", ref, "--repo", str(root)], path)
        load_before = os.getloadavg()
        times = _interleaved(contenders, args.rounds, cwd=work)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = {label: median(samples) for label, samples in times.items()}
    floor, index_s, torch_s = m["python -c pass"], m[PRINT_INDEX], m['python -c "import torch"']
    rows = [{"command": label, "median_s": m[label], "best_s": min(samples), "vs_python": m[label] / floor,
             "vs_print_index": m[label] / index_s,
             "vs_same_floor": m[label] / m[f"{WHEEL}{PRINT_INDEX}" if label.startswith(WHEEL) else PRINT_INDEX],
             "vs_import_torch": m[label] / torch_s, "rounds": len(samples)}
            for label, samples in times.items()]
    report("cli", f"fresh-process CLI start (median of {args.rounds} interleaved rounds; "
                  f"load average {load_before[0]:.1f} -> {load_after[0]:.1f})",
           rows, ["command", "median_s", "best_s", "vs_python", "vs_print_index", "vs_same_floor", "vs_import_torch",
                  "rounds"],
           {"rounds": args.rounds, "versions": args.versions, "names": args.names,
            "baseline": None if args.baseline is None else str(args.baseline),
            "load_average": {"before": load_before, "after": load_after}})


WHEEL = "wheel: "


def _wheel_contenders(work: Path, root: Path, ref: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The rows of this checkout built as a wheel and installed into a new virtual environment, as
    users install it (no editable finder at interpreter start; pip compiles the bytecode), its
    dependencies from this environment's site-packages (PYTHONPATH: not a site directory, so its
    ``.pth`` files, the editable finder's among them, are not run)."""
    checkout, source = Path(__file__).resolve().parents[1], work / "source"
    wheels, venv = work / "wheel", work / "venv"
    # built from a copy: setuptools writes build/ and *.egg-info into the folder it builds
    shutil.copytree(checkout, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "tests", "census", "stress"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(source)], check=True, cwd=work)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", *map(str, wheels.glob("*.whl"))], check=True)
    python, deps = str(venv / "bin" / "python"), {"PYTHONPATH": sysconfig.get_paths()["purelib"]}
    return {
        f"{WHEEL}python -c pass": ([python, "-c", "pass"], deps),
        f"{WHEEL}{PRINT_INDEX}": ([python, "-c", _PRINT_INDEX_SCRIPT, str(root)], deps),
        f"{WHEEL}modulelens ls": ([str(venv / "bin" / "modulelens"), "ls", "--repo", str(root)], deps),
        f"{WHEEL}modulelens show": ([str(venv / "bin" / "modulelens"), "show", ref, "--repo", str(root)], deps),
    }


def _interleaved(contenders: dict[str, tuple[list[str], dict[str, str]]], rounds: int,
                 cwd: Path) -> dict[str, list[float]]:
    """Run each command (with its extra environment) once per round, stdout to a pipe, in ``cwd``
    (outside any checkout, so none is found first by accident), rotating the order every round."""
    labels = list(contenders)
    times: dict[str, list[float]] = {label: [] for label in labels}
    envs = {label: fresh_process_env(OMP_NUM_THREADS="1", **extra) for label, (_, extra) in contenders.items()}
    for label in labels:  # untimed: writes the bytecode cache, as a pip install has (fresh_process_env)
        subprocess.run(contenders[label][0], check=True, stdout=subprocess.PIPE, env=envs[label], cwd=cwd)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            start = time.perf_counter()
            subprocess.run(contenders[label][0], check=True, stdout=subprocess.PIPE, env=envs[label], cwd=cwd)
            times[label].append(time.perf_counter() - start)
    return times


PRINT_INDEX = "python printing the index"
# The floor of `ls` (issue 37): what the repo stores for a listing (docs/repo-layout.md: each name's
# index head, the first log_bytes of its log; a {"rm": N} record removes version N), read with json
# and printed one line per live version, with the columns ls prints. No modulelens, no formatting.
_PRINT_INDEX_SCRIPT = """
import json, os, sys
from urllib.parse import unquote
lines = []
with os.scandir(os.path.join(sys.argv[1], "names")) as names:
    for entry in sorted(names, key=lambda e: e.name):
        with open(os.path.join(entry.path, "summary.json"), "rb") as f:
            head = json.loads(f.read())
        if not head["log"]:
            continue
        with open(os.path.join(entry.path, f"summary-{head['log']}.log"), "rb") as f:
            log = f.read(head["log_bytes"])
        versions = {}
        for record in json.loads(b"[" + log.rstrip(b"\\n").replace(b"\\n", b",") + b"]"):
            if "rm" in record:
                versions.pop(record["rm"], None)
            else:
                versions[record["v"]] = record
        name = unquote(entry.name)
        for v, r in sorted(versions.items()):
            lines.append(f"{name}:v{v}  {r['module_class']}  {r['calls']}  {', '.join(r['tags'])}  "
                         f"{r['nbytes']}  {r['created']}")
print("\\n".join(lines))
"""


if __name__ == "__main__":
    main()

"""The census driver: per family one capturing process, then one fresh replaying process.

Both run as subprocesses that append a JSON line per result (``census/worker.py``,
``tests/support/fidelity_replay.py --jsonl``). When one dies (a crash in native code, a hang past
the watchdog) the target or capture in flight is recorded as crashed and a new process goes on
past it, so one bad target never hides the others.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from census import outcomes as oc
from census.known import annotate
from census.worker import SAVED

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"
REPLAY = SUPPORT / "fidelity_replay.py"
# a worker is taken for hung after WATCHDOG seconds without a new result line in which it used no CPU
# (a busy worker on loaded shared cores is slow, not hung; targets have 240 CPU seconds), or after
# HARD_LIMIT seconds without a new line whatever it did
WATCHDOG, HARD_LIMIT = 300, 3600
PART = 40  # targets captured, then replayed, then their repo deleted (timm: about 60 MB a target)
FIRST_LINE = 600  # idle seconds before its first line (a worker imports its library and lists its targets)


@dataclass(frozen=True)
class Options:
    quick: bool = False
    seed: int = 0
    limits: tuple[tuple[str, int], ...] = ()  # family -> sample size in a full run
    only: tuple[str, ...] = ()  # target names (all families)
    nice: int = 0
    probe_only: bool = False  # build and run every target without modulelens, capture nothing
    keep_repos: bool = False  # keep each part's repo after its replay (in the work folder)

    def limit(self, family: str) -> int | None:
        return dict(self.limits).get(family)


def _env(extra_path: list[str]) -> dict[str, str]:
    path = [str(ROOT), str(SUPPORT), *extra_path]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a process killed while writing it
            pass
    return records


def _watch(command: list[str], env: dict[str, str], out: Path, log: Path, nice: int) -> int:
    """Run ``command`` until it exits, or kill it as hung (see WATCHDOG: no new line in ``out``
    and no CPU used).
    Its CPU seconds (user + system, from ``wait4``) are added to ``CPU`` under ``out``'s family."""
    prefix = ["nice", "-n", str(nice)] if nice else []
    with log.open("ab") as errors:
        process = subprocess.Popen(prefix + command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors)
        last_size, last_line = -1, time.monotonic()
        last_cpu, last_busy = -1.0, time.monotonic()
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.5)
            now, size, cpu = time.monotonic(), out.stat().st_size if out.exists() else 0, _cpu_of(process.pid)
            if size != last_size:
                last_size, last_line = size, now
            if cpu != last_cpu:
                last_cpu, last_busy = cpu, now
            idle = now - max(last_line, last_busy)
            if idle > (WATCHDOG if size else FIRST_LINE) or now - last_line > HARD_LIMIT:
                process.kill()
                _, status, usage = os.wait4(process.pid, 0)
                break
    family = out.name.split("-", 1)[0]
    with _cpu_lock:
        CPU[family] = CPU.get(family, 0.0) + usage.ru_utime + usage.ru_stime
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode


def _cpu_of(pid: int) -> float:
    """CPU seconds a running process has used so far (Linux /proc; -1 elsewhere: the watchdog then
    goes by new lines only)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# CPU seconds per family, all its processes (the budget in CI is CPU: wall on shared cores is not)
CPU: dict[str, float] = {}
_cpu_lock = threading.Lock()


def _tail(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.strip().splitlines()[-6:])[-1500:]


def worker_stage(stage: str, family: str, work: Path, options: Options, extra: list[str],
                 part: str = "") -> list[dict[str, Any]]:
    """Run ``census.worker STAGE FAMILY`` until every planned target has its results; a target
    in flight when the process died is recorded as a crash and a new process goes on past it.
    Returns the result records (``{"outcome": ...}`` or ``{"ran": ...}``). ``part`` names this
    run's files in ``work`` (a family is captured in parts)."""
    name = f"{family}-{part or stage}"
    out, skip, log = work / f"{name}.jsonl", work / f"{name}-skip.txt", work / f"{name}.log"
    command = [sys.executable, "-m", "census.worker", stage, family, str(out), "--seed", str(options.seed),
               "--skip", str(skip), *extra]
    if options.quick:
        command.append("--quick")
    if options.limit(family) is not None:
        command += ["--limit", str(options.limit(family))]
    if options.only:
        command += ["--only", ",".join(options.only)]
    env = _env(_family_path(family, stage))
    skip.write_text("")
    while True:
        code = _watch([*command], env, out, log, options.nice)
        records = _lines(out)
        plan = next((r["plan"] for r in records if "plan" in r), None)
        if plan is None:  # the family itself failed to enumerate its targets: never a documented limitation
            return [{"outcome": oc.Outcome(family, "(the family)", oc.CAPTURE_CRASH, message=f"the {stage} worker "
                                           f"exited {code} before listing the family's targets: {_tail(log)}").to_json()}]
        finished = {r.get("outcome", r.get("ran", {})).get("target") for r in records if "outcome" in r or "ran" in r}
        started = [r["start"] for r in records if "start" in r]
        crashed = [name for name in started if name not in finished]
        for name in crashed:
            category = oc.CAPTURE_CRASH if stage == "capture" else oc.RUN
            crash = oc.Outcome(family, name, category, message=f"the {stage} process exited {code}: {_tail(log)}")
            with out.open("a") as handle:
                handle.write(json.dumps({"outcome": crash.to_json()}) + "\n")
        done = finished | set(crashed)
        if code == 0 or all(name in done for name in plan):
            return [r for r in _lines(out) if "outcome" in r or "ran" in r]
        skip.write_text("\n".join(sorted(done)))


def replay_family(family: str, repo: Path, work: Path, saved: list[oc.Outcome], options: Options,
                  part: str = "replay") -> list[oc.Outcome]:
    out, log = work / f"{family}-{part}.jsonl", work / f"{family}-{part}.log"
    pending = {o.label: o for o in saved}
    env = _env(_family_path(family, "replay"))
    attempt = 0
    while True:
        done = {r["label"]: r for r in _lines(out)}
        todo = {label: o.ref for label, o in pending.items() if label not in done}
        if not todo:
            break
        manifest = work / f"{family}-{part}-manifest-{attempt}.json"
        manifest.write_text(json.dumps(todo))
        code = _watch([sys.executable, str(REPLAY), str(repo), str(manifest), "--jsonl", str(out)], env, out, log,
                      options.nice)
        attempt += 1
        done = {r["label"]: r for r in _lines(out)}
        in_flight = next((label for label in todo if label not in done), None)
        if code != 0 and in_flight is not None:
            crash = {"label": in_flight, "status": "CRASH", "error": f"the replay process exited {code}: {_tail(log)}"}
            with out.open("a") as handle:
                handle.write(json.dumps(crash) + "\n")
        elif in_flight is not None:
            raise RuntimeError(f"the replay process exited 0 without replaying {in_flight}")
    results = []
    for label, result in {r["label"]: r for r in _lines(out)}.items():
        outcome = pending[label]
        if result.get("status") == "CRASH":
            outcome.category, outcome.message = oc.REPLAY_CRASH, result["error"]
        else:
            oc.from_replay(outcome, result)
        results.append(outcome)
    return results


def _family_path(family: str, stage: str) -> list[str]:
    module = importlib.import_module(f"census.families.{family}")
    stage = "capture" if stage == "probe" else stage  # the probe imports what the capture imports
    return [str(ROOT / p) for p in getattr(module, "EXTRA_PATH", {}).get(stage, [])]


def run_family(family: str, options: Options, work: Path) -> list[oc.Outcome]:
    """Probe (no modulelens), then per part of ``PART`` targets: capture what ran, replay what was
    saved in a fresh process, delete the part's repo (a family's captures never pile up on disk)."""
    probed = worker_stage("probe", family, work, options, [])
    results = [oc.Outcome(**r["outcome"]) for r in probed if "outcome" in r]
    ran = {r["ran"]["target"]: r["ran"] for r in probed if "ran" in r}
    if options.probe_only:
        return results + [oc.Outcome(family, name, oc.PROBED, message="; ".join(plan["failed"].values()),
                                     seconds=plan["seconds"]) for name, plan in ran.items()]
    names = list(ran)
    for index in range(0, len(names), PART):
        part = index // PART
        plans, repo = work / f"{family}-plans-{part}.json", work / f"repo-{family}-{part}"
        plans.write_text(json.dumps({name: ran[name] for name in names[index:index + PART]}))
        captured = [oc.Outcome(**r["outcome"]) for r in worker_stage(
            "capture", family, work, options, ["--repo", str(repo), "--plan", str(plans)], part=f"capture{part}")]
        saved = [o for o in captured if o.category == SAVED]
        results += [o for o in captured if o.category != SAVED]
        if saved:
            results += replay_family(family, repo, work, saved, options, part=f"replay{part}")
        if not options.keep_repos:
            shutil.rmtree(repo, ignore_errors=True)
    return results


def run(families: list[str], options: Options, work: Path, jobs: int = 1) -> tuple[list[oc.Outcome], dict[str, float]]:
    """Every family's outcomes (in the order of ``families``) and its wall seconds (its CPU seconds
    are in ``CPU``); ``jobs`` families at a time (each family is its own processes, so they share
    nothing). ``work`` holds the repos, manifests and the workers' logs."""
    work.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    def one(family: str) -> list[oc.Outcome]:
        start = time.perf_counter()
        found = annotate(run_family(family, options, work))
        seconds[family] = round(time.perf_counter() - start, 1)
        print(f"census: {family} done in {seconds[family]:.0f} s", file=sys.stderr, flush=True)
        return found

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, families))
    return [o for found in results for o in found], seconds

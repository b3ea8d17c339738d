"""The capturing process of one census family: ``python -m census.worker FAMILY REPO OUT.jsonl [options]``.

Writes one JSON line per event to OUT: first ``{"plan": [target names]}``, then per target
``{"start": name}``, and per capture or per target that never got to capture an outcome
(``census.outcomes.Outcome``; a capture that was saved has ``ref`` and category ``"saved"``, to be
replayed). A target that kills this process leaves its ``start`` line without outcomes: the
driver (``census/run.py``) records it as crashed and starts a new worker past it.

Each target is captured as a user would: ``modulelens.capture`` with its defaults (not strict, so
a problem inside capture warns and the job goes on), the model in train mode and then in eval
mode, caches on (the family's job decides how the model is called).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

import modulelens
from census import outcomes as oc
from census.rules import by_rule
from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

SAVED = "saved"  # a capture waiting for its replay
TARGET_SECONDS = 240  # one target's build, probe and two captures; past it the target is a failure


class TargetTimeoutError(Exception):
    pass


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def expire(_signum: int, _frame: Any) -> None:
        raise TargetTimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "x"


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:1500]


def _called(model: nn.Module, names: dict[str, str], job: Job) -> set[str]:
    """Run the job once without capture (eval mode, as a smoke test); the submodule labels it called."""
    seen: set[str] = set()
    handles = [model.get_submodule(name).register_forward_pre_hook(lambda *_a, label=label: seen.add(label))
               for label, name in names.items()]
    try:
        torch.manual_seed(1)
        job(model)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _capture_mode(family: str, target: Target, model: nn.Module, job: Job, names: dict[str, str], mode: str,
                  repo: str) -> list[oc.Outcome]:
    prefix = f"census/{family}/{slug(target.name)}/{mode}"
    model.train(mode == "train")
    patterns = sorted({name or "." for name in names.values()})
    job_error: BaseException | None = None
    cap = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with modulelens.capture(model, targets=patterns, repo=repo, name=prefix,
                                    record=modulelens.Recording(max_calls=target.calls)) as cap:
                torch.manual_seed(1)
                job(model)
        except TargetTimeoutError:
            raise
        except Exception as error:  # the user's job raised while captured
            job_error = error
    capture_warnings = [str(w.message)[:1000] for w in caught if issubclass(w.category, modulelens.CaptureWarning)]
    labels = {label: f"{target.name}:{label}@{mode}" for label in names}
    if job_error is not None:
        try:
            torch.manual_seed(1)
            job(model)
        except Exception as again:
            category, message = oc.RUN, f"in {mode} mode, without capture too: {_error(again)}"
        else:
            trace = "".join(traceback.format_exception(job_error, limit=-4))
            category, message = oc.JOB_BROKE, f"in {mode} mode: {_error(job_error)}\n{trace}"
        return [oc.Outcome(family, target.name, category, labels[label], names[label], mode, message,
                           warnings=capture_warnings) for label in names]
    saved = {info.name: info.ref for info in (cap.saved if cap is not None else [])}
    results = []
    for label, name in names.items():
        ref = saved.get(f"{prefix}/{name}" if name else prefix)
        if ref is None:
            why = "; ".join(capture_warnings) or f"not saved and no warning (saved: {sorted(saved)})"
            results.append(oc.Outcome(family, target.name, oc.DROPPED, labels[label], name, mode, why,
                                      warnings=capture_warnings))
        else:
            results.append(oc.Outcome(family, target.name, SAVED, labels[label], name, mode, ref=ref,
                                      warnings=capture_warnings))
    return results


def capture_target(family: str, target: Target, repo: str) -> list[oc.Outcome]:
    start = time.perf_counter()
    try:
        with _deadline(TARGET_SECONDS):
            results = _capture_target(family, target, repo)
    except TargetTimeoutError as error:
        results = [oc.Outcome(family, target.name, oc.RUN, message=f"the target {error} (build, probe and captures)")]
    for outcome in results:
        outcome.seconds = round(time.perf_counter() - start, 2)
    return results


def _capture_target(family: str, target: Target, repo: str) -> list[oc.Outcome]:
    torch.manual_seed(0)
    try:
        with modulelens.track_init():
            model = target.build()
    except TargetTimeoutError:
        raise
    except Exception as error:
        reason = str(error) if isinstance(error, CannotBuildError) else _error(error)
        return [oc.Outcome(family, target.name, oc.BUILD, message=reason)]
    try:
        model.eval()
        job = target.job(model)
    except TargetTimeoutError:
        raise
    except Exception as error:
        reason = str(error) if isinstance(error, CannotBuildInputsError) else _error(error)
        return [oc.Outcome(family, target.name, oc.INPUTS, message=reason)]
    names = (target.submodules or by_rule)(model)
    try:
        with torch.no_grad():
            called = _called(model, names, job)
    except TargetTimeoutError:
        raise
    except Exception as error:
        return [oc.Outcome(family, target.name, oc.RUN, message=f"in eval mode, without capture: {_error(error)}")]
    names = {label: name for label, name in names.items() if label in called or not name}
    results: list[oc.Outcome] = []
    for mode in ("train", "eval"):
        results += _capture_mode(family, target, model, job, names, mode, repo)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m census.worker")
    parser.add_argument("family")
    parser.add_argument("repo")
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--skip", default="", help="a file of target names to skip, one a line (already done)")
    parser.add_argument("--only", default="", help="comma-separated target names")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    family = importlib.import_module(f"census.families.{args.family}")
    sample = Sample(args.quick, args.seed, args.limit, frozenset(filter(None, args.only.split(","))))
    targets: list[Target] = family.targets(sample)
    skip = set(Path(args.skip).read_text().splitlines()) if args.skip else set()
    out = Path(args.out)

    def emit(record: dict[str, Any]) -> None:
        with out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()

    emit({"plan": [t.name for t in targets]})
    for target in targets:
        if target.name in skip:
            continue
        emit({"start": target.name})
        for outcome in capture_target(args.family, target, args.repo):
            emit({"outcome": outcome.to_json()})
    sys.exit(0)


if __name__ == "__main__":
    main()

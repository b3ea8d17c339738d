"""A census family's worker process: ``python -m census.worker STAGE FAMILY OUT.jsonl [options]``.

Two stages, each its own process (``census/run.py`` starts them):

* ``probe``: builds every target, finds inputs it accepts and runs its job in train and then eval
  mode **in a process where modulelens is never imported**. A target that fails here fails for
  the census's own reasons (``could not build the model`` / ``inputs`` / ``run``), never for
  modulelens's: those categories cannot hide a modulelens error. A target that runs is reported
  with the modes it ran in and the submodules each mode called.
* ``capture``: for the targets the probe ran, the same steps under ``modulelens.track_init()`` and
  ``modulelens.capture`` with its defaults (not strict, so a problem inside capture warns and the
  job goes on). Anything that raises here ran without modulelens, so it is ``job broke under
  capture``: the fail-open promise broken.

Writes one JSON line per event to OUT: first ``{"plan": [target names]}``, then per target
``{"start": name}`` and its results (``{"outcome": ...}``: a failure, or in the capture stage a
saved capture with its ``ref``, to be replayed; ``{"ran": ...}``: the probe's plan for capture). A
target that kills the process leaves its ``start`` line without results: the driver records it as
crashed and starts a new worker past it.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from census import outcomes as oc
from census.rules import by_rule
from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

SAVED = "saved"  # a capture waiting for its replay
# CPU seconds (not wall: the census runs on shared cores) for one target's build, inputs and two runs
# or captures; past it the target is a failure. A wall-clock hang is the driver's watchdog's.
TARGET_SECONDS = 240
MODES = ("train", "eval")  # in this order in both stages, so the model's state evolves the same way


class TargetTimeoutError(Exception):
    pass


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Raise TargetTimeoutError in the block once this process has used ``seconds`` of CPU."""
    def expire(_signum: int, _frame: Any) -> None:
        raise TargetTimeoutError(f"took longer than {seconds} CPU seconds")

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "x"


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:1500]


def _trace(error: BaseException) -> str:
    return _error(error) + "\n" + "".join(traceback.format_exception(error, limit=-4))[-2500:]


def _run_job(model: nn.Module, job: Job, mode: str) -> None:
    """The job as users run it: train or eval mode, gradients on, a fixed seed."""
    model.train(mode == "train")
    torch.manual_seed(1)
    job(model)


def _prepare(target: Target, build: Callable[[], nn.Module]) -> tuple[nn.Module, Job]:
    """Build (seed 0) and find the job, in eval mode (the job may probe the model without capture)."""
    torch.manual_seed(0)
    model = build()
    model.eval()
    return model, target.job(model)


# ---------------------------------------------------------------------------------------------
# probe: no modulelens in this process

def probe_target(family: str, target: Target) -> dict[str, Any]:
    """``{"outcome": ...}`` (a failure before capture) or ``{"ran": {...}}`` (what to capture)."""
    start = time.perf_counter()
    try:
        with _deadline(TARGET_SECONDS):
            try:
                torch.manual_seed(0)
                model = target.build()
            except TargetTimeoutError:
                raise
            except Exception as error:
                reason = str(error) if isinstance(error, CannotBuildError) else _error(error)
                return {"outcome": oc.Outcome(family, target.name, oc.BUILD, message=reason).to_json()}
            try:
                model.eval()
                job = target.job(model)
            except TargetTimeoutError:
                raise
            except Exception as error:
                reason = str(error) if isinstance(error, CannotBuildInputsError) else _error(error)
                return {"outcome": oc.Outcome(family, target.name, oc.INPUTS, message=reason).to_json()}
            names = (target.submodules or by_rule)(model)
            called: dict[str, list[str]] = {}
            failed: dict[str, str] = {}
            for mode in MODES:
                seen: set[str] = set()
                handles = [_watch_calls(model, name, lambda *_a, label=label, seen=seen: seen.add(label))
                           for label, name in names.items()]
                try:
                    _run_job(model, job, mode)
                except TargetTimeoutError:
                    raise
                except Exception as error:
                    failed[mode] = f"in {mode} mode: {_error(error)}"
                    continue
                finally:
                    for handle in handles:
                        handle.remove()
                called[mode] = [label for label in names if label in seen or not names[label]]
    except TargetTimeoutError as error:
        message = f"the target {error} (build, inputs and a run per mode, without modulelens)"
        return {"outcome": oc.Outcome(family, target.name, oc.RUN, message=message).to_json()}
    seconds = round(time.perf_counter() - start, 2)
    return {"ran": {"target": target.name, "names": names, "called": called, "failed": failed, "seconds": seconds}}


class _MethodWatch:
    """Calls ``on_call`` on each call of ``module.<method>`` (wrapped on its class, as capture does:
    ``__call__`` cannot be wrapped on an instance) until removed; the probe has no modulelens. A
    method bound to the instance in ``__init__`` (torchmetrics' ``update`` and ``compute``) is
    wrapped where it is: the class's is never called, and the probe said such targets never ran,
    so the census left them out without a word."""

    def __init__(self, module: nn.Module, method: str, on_call: Callable[..., Any]) -> None:
        self.cls, self.method = type(module), method
        self.instance: nn.Module | None = None
        bound = vars(module).get(method)
        if callable(bound) and method != "__call__":
            self.instance, self.own = module, bound

            def watched_bound(*args: Any, **kwargs: Any) -> Any:
                on_call()
                return bound(*args, **kwargs)
            vars(module)[method] = watched_bound
            return
        self.own = self.cls.__dict__.get(method)
        original = getattr(self.cls, method)

        def watched(instance: Any, *args: Any, **kwargs: Any) -> Any:
            if instance is module:
                on_call()
            return original(instance, *args, **kwargs)
        setattr(self.cls, method, watched)

    def remove(self) -> None:
        if self.instance is not None:
            vars(self.instance)[self.method] = self.own
        elif self.own is not None:
            setattr(self.cls, self.method, self.own)
        else:
            delattr(self.cls, self.method)


def _watch_calls(model: nn.Module, name: str, on_call: Callable[..., Any]) -> Any:
    """A handle that sees the calls of target ``name``: a module's forward pre-hook, or for a method
    target ``path:method`` (census/families/methods.py) a wrapper of that method."""
    path, _, method = name.rpartition(":") if ":" in name else (name, "", "")
    module = model.get_submodule(path.lstrip(".")) if path.lstrip(".") else model  # a ScriptModule has none
    if method:
        return _MethodWatch(module, method, on_call)
    if isinstance(module, torch.jit.ScriptModule):  # torch refuses hooks on them: the family names only
        on_call()  # TorchScript submodules its model calls (census/families/tools.py)
        return _NoWatch()
    return module.register_forward_pre_hook(on_call)


class _NoWatch:
    def remove(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# capture: the same steps under modulelens

def _broke(family: str, target: Target, labels: dict[str, str], names: dict[str, str], mode: str | None,
           message: str) -> list[oc.Outcome]:
    return [oc.Outcome(family, target.name, oc.JOB_BROKE, labels[label], names[label], mode, message)
            for label in labels]


def _capture_mode(family: str, target: Target, model: nn.Module, job: Job, names: dict[str, str], mode: str,
                  repo: str) -> list[oc.Outcome]:
    import modulelens
    from modulelens.tracing.methods import target_capture_name

    prefix = f"census/{family}/{slug(target.name)}/{mode}"
    patterns = sorted({name or "." for name in names.values()})
    labels = {label: f"{target.name}:{label}@{mode}" for label in names}
    cap = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with modulelens.capture(model, targets=patterns, repo=repo, name=prefix,
                                    record=modulelens.Recording(max_calls=target.calls)) as cap:
                _run_job(model, job, mode)
        except TargetTimeoutError:
            raise
        except Exception as error:  # the job ran in this mode without modulelens (the probe): capture broke it
            return _broke(family, target, labels, names, mode, f"in {mode} mode: {_trace(error)}")
    capture_warnings = [str(w.message)[:1000] for w in caught if issubclass(w.category, modulelens.CaptureWarning)]
    saved = {info.name: info.ref for info in (cap.saved if cap is not None else [])}
    results = []
    for label, name in names.items():
        ref = saved.get(target_capture_name(prefix, name))  # "<prefix>/<name>", a method's "<...>.<method>"
        if ref is None:
            why = "; ".join(capture_warnings) or f"not saved and no warning (saved: {sorted(saved)})"
            results.append(oc.Outcome(family, target.name, oc.DROPPED, labels[label], name, mode, why,
                                      warnings=capture_warnings))
        else:
            results.append(oc.Outcome(family, target.name, SAVED, labels[label], name, mode, ref=ref,
                                      warnings=capture_warnings))
    return results


def capture_target(family: str, target: Target, plan: dict[str, Any], repo: str) -> list[oc.Outcome]:
    """Capture a target the probe ran, in the modes it ran in; the modes it failed in are ``could
    not run the model`` (without modulelens, in the probe)."""
    import modulelens

    start = time.perf_counter()
    names: dict[str, str] = plan["names"]
    results = [oc.Outcome(family, target.name, oc.RUN, f"{target.name}:{label}@{mode}", names[label], mode, message)
               for mode, message in plan["failed"].items() for label in names]
    everything = [f"{target.name}:{label}@{mode}" for mode in plan["called"] for label in plan["called"][mode]]
    try:
        with _deadline(TARGET_SECONDS):
            try:
                with modulelens.track_init():
                    model, job = _prepare(target, target.build)
            except TargetTimeoutError:
                raise
            except Exception as error:  # built and ran in the probe, without modulelens
                message = f"building under modulelens.track_init() (or finding its inputs) raised: {_trace(error)}"
                return results + [oc.Outcome(family, target.name, oc.JOB_BROKE, label, None, None, message)
                                  for label in everything]
            for mode in MODES:
                if mode in plan["called"]:
                    chosen = {label: names[label] for label in plan["called"][mode]}
                    results += _capture_mode(family, target, model, job, chosen, mode, repo)
    except TargetTimeoutError as error:
        done = {o.label for o in results}
        message = f"the target {error} under capture (without modulelens it took {plan['seconds']} s)"
        results += [oc.Outcome(family, target.name, oc.CAPTURE_TIMEOUT, label, None, None, message)
                    for label in everything if label not in done]
    for outcome in results:
        outcome.seconds = round(time.perf_counter() - start, 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m census.worker")
    parser.add_argument("stage", choices=["probe", "capture"])
    parser.add_argument("family")
    parser.add_argument("out")
    parser.add_argument("--repo", default="", help="capture: the repo to save into")
    parser.add_argument("--plan", default="", help="capture: the probe's results ({target: ran})")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--skip", default="", help="a file of target names to skip, one a line (already done)")
    parser.add_argument("--only", default="", help="comma-separated target names")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    family = importlib.import_module(f"census.families.{args.family}")
    plans: dict[str, Any] = json.loads(Path(args.plan).read_text()) if args.plan else {}
    only = frozenset(plans) if args.stage == "capture" else frozenset(filter(None, args.only.split(",")))
    sample = Sample(args.quick, args.seed, args.limit, only)
    targets: list[Target] = family.targets(sample) if only or args.stage == "probe" else []
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
        if args.stage == "probe":
            emit(probe_target(args.family, target))
            if "modulelens" in sys.modules:  # the probe's verdicts must not depend on modulelens
                raise SystemExit(f"census: the probe of {target.name} imported modulelens")
        else:
            for outcome in capture_target(args.family, target, plans[target.name], args.repo):
                emit({"outcome": outcome.to_json()})
    sys.exit(0)


if __name__ == "__main__":
    main()

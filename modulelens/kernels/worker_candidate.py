"""Candidate process of ``modulelens kernel verify`` (internal; ``python -P .../worker_candidate.py SPEC``).

Runs the candidate on the samples the reference process wrote. It runs as a plain script and
imports nothing from the modulelens package: its torch-only helpers (:mod:`.exchange`,
:mod:`modulelens.format.op_watch`, :mod:`modulelens.tools.timing`, and for a trace :mod:`modulelens.format.op_trace`
with the statistics of :mod:`modulelens.format.shape_only`) are loaded by file path before any
candidate code runs. It then blocks imports of modulelens and of the reference's own module, never holds
the reference module or any expected output, passes clones of the inputs and checks that they were
not modified, counts Triton launches, counts the heavy aten ops (matmul, convolution, attention)
the candidate's forward runs through PyTorch, watches threads and every function of torch, the
timers and its own helpers for replacement, and writes the candidate's outputs. Per call it notes
outputs that share memory with an input or with an earlier call's output, and parameters a
ModelNew wrote to; afterwards it runs the exploit probes of docs/kernels.md ("Known exploits"): the
same input buffers refilled with another sample's values (work skipped on repeated inputs), the
first sample ten times more (warm-up gaming), and every returned output compared with the copy
taken when its call returned (work still running). The parent process compares and judges.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

_HERE = Path(__file__).resolve().parent


def _load_helper(name: str, path: Path) -> ModuleType:
    """Load a torch-only helper module by path (importing the modulelens package would hand the
    candidate everything it may not touch)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:  # the same files, as the type checker sees them (it cannot follow a by-path load)
    from modulelens.format import op_trace as _op_trace
    from modulelens.format import op_watch as _op_watch
    from modulelens.format import shape_only as _shape_only
    from modulelens.kernels import exchange as _exchange
    from modulelens.tools import timing as _timing
else:
    _exchange = _load_helper("_modulelens_kernel_exchange", _HERE / "exchange.py")
    _op_watch = _load_helper("_modulelens_op_watch", _HERE.parent / "format" / "op_watch.py")
    _timing = _load_helper("_modulelens_timing", _HERE.parent / "tools" / "timing.py")
    _shape_only = _load_helper("_modulelens_shape_only", _HERE.parent / "format" / "shape_only.py")
    _op_trace = _load_helper("_modulelens_op_trace", _HERE.parent / "format" / "op_trace.py")
decode_arg, flatten_output, same_bits = _exchange.decode_arg, _exchange.flatten_output, _exchange.same_bits
aliased_inputs, max_difference = _exchange.aliased_inputs, _exchange.max_difference
to_device, write_json, error_text = _exchange.to_device, _exchange.write_json, _exchange.error_text
load_tensors, save_tensors = _exchange.load_tensors, _exchange.save_tensors
OpCounter, CudaTimer = _op_watch.OpCounter, _timing.CudaTimer


class _ImportBlocker(importlib.abc.MetaPathFinder):
    """Refuses imports of the reference (modulelens, the module that defines the reference class)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        for name in self.names:
            if fullname == name or fullname.startswith(name + "."):
                raise ImportError(f"kernel candidates may not import {fullname} (it holds the reference)")
        return None


_TIMER_NAMES = ("time.perf_counter", "time.perf_counter_ns", "time.time", "time.monotonic", "torch.cuda.synchronize",
                "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
                "torch.cuda.Event.synchronize", "torch.cuda.current_stream", "torch.cuda.Stream")


def _lookup(dotted: str) -> object:
    root, *rest = dotted.split(".")
    obj: Any = sys.modules.get(root)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


# The functions the worker's checks and the timings rest on, and what a candidate would replace to fool
# them (METR saw models overwrite their graders' equality operators and timers): every attribute of these
# modules and classes, by identity. Additions are not replacements and are ignored.
_WATCHED_MODULES = ("torch", "torch.nn.functional", "torch.cuda", "torch.testing", "time", "threading",
                    "safetensors.torch")
_WATCHED_CLASSES = ("torch.Tensor", "torch.nn.Module", "torch.cuda.Event")


class _Watch:
    """Which watched functions were replaced since it was made (``replaced()``)."""

    def __init__(self, helpers: list[ModuleType]) -> None:
        self.helpers = helpers
        self.before = self._snapshot()

    def _snapshot(self) -> dict[str, object]:
        """Callables by dotted name: public ones of the library modules (their private state, such as
        ``torch.cuda._initialized``, changes by itself), all of the worker's own helpers, and every
        method of the classes (dunders included: ``Tensor.__eq__``)."""
        found: dict[str, Any] = {}
        modules = [(name, sys.modules.get(name), False) for name in _WATCHED_MODULES]
        modules += [(module.__name__, module, True) for module in self.helpers]
        for name, module, private in modules:
            if module is not None:
                found.update((f"{name}.{attr}", value) for attr, value in list(vars(module).items())
                             if callable(value) and not attr.startswith("__") and (private or not attr.startswith("_")))
        for dotted in _WATCHED_CLASSES:
            cls = _lookup(dotted)
            if isinstance(cls, type):
                for klass in reversed(cls.__mro__):  # later (more derived) classes win, as in attribute lookup
                    found.update((f"{dotted}.{attr}", value) for attr, value in vars(klass).items()
                                 if callable(value) or hasattr(value, "__get__"))
        return found

    def replaced(self) -> list[str]:
        now = self._snapshot()
        return sorted(name for name, value in self.before.items() if name in now and now[name] is not value)


class _LaunchCounter:
    """Counts Triton kernel launches (compiled or interpreted) by wrapping their ``run``."""

    def __init__(self) -> None:
        self.count = 0
        self.installed = False

    def install(self) -> None:
        try:
            import triton.runtime.jit as jit
        except Exception:  # triton missing or broken: the candidate's own import will say so
            return
        classes: list[Any] = [jit.JITFunction]  # Any: triton ships no type information
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except Exception:
            pass
        for cls in classes:
            cls.run = self._counting(cls.run)
        self.installed = True


    def _counting(self, original: Callable[..., object]) -> Callable[..., object]:
        counter = self

        def run(kernel: object, *args: object, **kwargs: object) -> object:
            if not kwargs.get("warmup", False):
                counter.count += 1
            return original(kernel, *args, **kwargs)

        return run


def _load_candidate(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("modulelens_candidate", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["modulelens_candidate"] = module
    spec.loader.exec_module(module)
    return module


class _CandidateRun:
    """One run of the candidate over every sample; ``result`` is what the parent reads."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.out_dir = Path(spec["out_dir"])
        data_dir = Path(spec["data_dir"])
        self.device = torch.device(spec["device"])
        self.result: dict[str, Any] = {"entry": None, "samples": [], "weights": {}, "checks": {}, "timing": {}}
        self.outputs: dict[str, torch.Tensor] = {}
        self.progress("setup")
        for name in list(sys.modules):
            if any(name == b or name.startswith(b + ".") for b in spec["blocked_modules"]):
                del sys.modules[name]
        sys.meta_path.insert(0, _ImportBlocker(spec["blocked_modules"]))
        self.counter = _LaunchCounter()
        if spec.get("count_triton_launches"):
            self.counter.install()
        self.result["checks"]["triton_launches_counted"] = self.counter.installed
        self.timer = CudaTimer(self.device) if spec.get("timing") and self.device.type == "cuda" else None
        self.synchronize = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.info = json.loads((data_dir / "samples.json").read_text())
        self.inputs = load_tensors(data_dir / "inputs.safetensors")
        self.weights = load_tensors(data_dir / "weights.safetensors")
        with OpCounter():  # entering a dispatch mode imports torch._dynamo, which wraps torch.manual_seed:
            torch.zeros(1).add_(1)  # torch's own patching happens before the snapshot, not inside a call
        self.watch = _Watch([_exchange, _op_watch, _timing, _shape_only, _op_trace, sys.modules[__name__]])
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.entry: Any = None
        self.model: Any = None
        self.returned: list[tuple[int, list[torch.Tensor]]] = []  # every sample's output tensors, kept alive

    def progress(self, phase: str, sample: str | None = None) -> None:
        write_json(self.out_dir / "progress.json", {"phase": phase, **({"sample": sample} if sample else {})})

    def check_environment(self, where: str) -> None:
        """Timer or other watched functions replaced, or threads left running, since the start."""
        replaced = self.watch.replaced()
        timers = [name for name in replaced if name in _TIMER_NAMES]
        if timers:
            self.result["checks"].setdefault("timers_patched", {})[where] = timers
        others = [name for name in replaced if name not in _TIMER_NAMES]
        if others:
            self.result["checks"].setdefault("patched", {})[where] = others
        extra = [t.name for t in threading.enumerate() if t.ident not in self.threads_before and t.is_alive()]
        if extra:
            self.result["checks"].setdefault("threads_left_running", {})[where] = extra

    def finish(self) -> int:
        write_json(self.out_dir / "candidate.json", self.result)
        save_tensors(self.out_dir / "outputs.safetensors", self.outputs)
        return 0

    def load(self) -> bool:
        """Import the candidate, pick its entry point, build ModelNew; ``False`` (with
        ``load_error``) when that fails."""
        self.progress("import")
        try:
            module = _load_candidate(Path(self.spec["candidate"]))
        except BaseException as error:
            self.result["load_error"] = error_text(error)
            return False
        self.check_environment("import")
        entry_name = self.spec.get("entry", "auto")
        if entry_name == "auto":
            entry_name = "ModelNew" if isinstance(getattr(module, "ModelNew", None), type) else "kernel_function"
        self.entry = getattr(module, entry_name, None)
        self.result["entry"] = entry_name
        if self.entry is None or not callable(self.entry):
            self.result["load_error"] = (f"the candidate defines no {entry_name} "
                                         "(expected class ModelNew or def kernel_function)")
            return False
        if entry_name != "ModelNew":
            return True
        self.progress("construct ModelNew")
        try:
            torch.manual_seed(int(self.spec["seed"]))
            with torch.no_grad():
                model = self.entry(*self.info["init_inputs"])
            self.model = model.to(self.device) if isinstance(model, torch.nn.Module) else model
        except BaseException as error:
            self.result["load_error"] = f"ModelNew(*init_inputs) failed: {error_text(error)}"
            return False
        self.check_environment("construct")
        return True

    def load_state(self, index: int) -> None:
        """Copy the captured parameters/buffers of state ``index`` into ModelNew by name and shape."""
        own: dict[str, torch.Tensor] = {}
        if isinstance(self.model, torch.nn.Module):
            own.update(self.model.named_parameters(remove_duplicate=False))
            own.update(self.model.named_buffers(remove_duplicate=False))
        loaded, missing, mismatched = [], [], []
        prefix = f"state{index}."
        with torch.no_grad():
            for key, value in self.weights.items():
                if not key.startswith(prefix):
                    continue
                name = key[len(prefix):]
                target = own.get(name)
                if target is None:
                    missing.append(name)
                elif target.shape != value.shape:
                    mismatched.append(f"{name}: {list(target.shape)} != captured {list(value.shape)}")
                else:
                    target.copy_(value)
                    loaded.append(name)
        self.result["weights"] = {"loaded": loaded, "missing": missing, "mismatched": mismatched}

    def prepare(self, sample: dict[str, Any]) -> tuple[list[Any], Any]:
        """Fresh device copies of everything the entry point is called with, and the call."""
        args = to_device([decode_arg(a, self.inputs) for a in sample["args"]], self.device)
        if self.model is not None:
            return list(args), lambda: self.model(*args)
        extra = [to_device(self.weights[f"state{sample['state']}.{n}"], self.device) for n in self.info["weight_names"]]
        everything = list(args) + extra
        return everything, lambda: self.entry(*everything)

    def run_samples(self) -> int | None:
        """Every sample once, with the per-call checks; the index of the first that ran."""
        names = list(self.info["arg_names"]) + ([] if self.model is not None else list(self.info["weight_names"]))
        has_buffers = isinstance(self.model, torch.nn.Module) and any(True for _ in self.model.buffers())
        loaded_state: int | None = None
        first_ok: int | None = None
        for j, sample in enumerate(self.info["samples"]):
            record: dict[str, Any] = {"id": sample["id"]}
            self.result["samples"].append(record)
            self.progress("call", sample["id"])
            if sample.get("skip"):
                record["skipped"] = sample["skip"]
                continue
            if self.model is not None and (loaded_state != sample["state"] or has_buffers):
                self.load_state(sample["state"])  # reloaded every call when there are buffers: a call may change them
                loaded_state = sample["state"]
            if isinstance(self.model, torch.nn.Module):
                self.model.train(sample["training"])
            if self._run_one(j, sample, record, names) and first_ok is None:
                first_ok = j
        return first_ok

    def _run_one(self, j: int, sample: dict[str, Any], record: dict[str, Any], names: list[str]) -> bool:
        passed, run = self.prepare(sample)
        originals = [to_device(v, torch.device("cpu")) for v in passed]
        parameters = self._parameters()
        parameters_before = {name: value.detach().to("cpu", copy=True) for name, value in parameters}
        launches = self.counter.count
        ops = OpCounter()
        try:
            start = time.perf_counter()
            with ops:
                output = run()
            if self.synchronize is not None:
                self.synchronize(self.device)
            record["seconds"] = time.perf_counter() - start
        except BaseException as error:
            record["error"] = error_text(error)
            self.check_environment(sample["id"])
            return False
        record["triton_launches"] = self.counter.count - launches if self.counter.installed else None
        record["torch_heavy_ops"] = ops.heavy()
        record["mutated_inputs"] = _mutated(passed, originals, names)
        record["mutated_parameters"] = [name for name, value in parameters
                                        if not same_bits(value.detach(), parameters_before[name])]
        record["output_problems"] = _output_problems(output, self.device)
        own = [(f"parameter {name}", value) for name, value in parameters]
        record["output_aliases"] = aliased_inputs(output, list(zip(names, passed, strict=False)) + own)
        record["output"] = flatten_output(output, f"s{j}", self.outputs)  # a copy taken as the call returns
        tensors = [leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)]
        earlier = [self.info["samples"][k]["id"] for k, kept in self.returned
                   if any(_same_memory(t, other) for t in tensors for other in kept)]
        if earlier:
            record["same_output_memory_as"] = earlier
        self.returned.append((j, tensors))
        self.check_environment(sample["id"])
        return True

    def _parameters(self) -> list[tuple[str, torch.Tensor]]:
        """ModelNew's parameters (a forward that writes into its own weights changes the next call)."""
        if not isinstance(self.model, torch.nn.Module):
            return []
        return list(self.model.named_parameters())

    def late_writes(self) -> None:
        """Every returned output against the copy taken when its call returned: a change means work
        still ran after the return (a thread, another stream) or a later call wrote into it (an output
        buffer reused across calls). GPU MODE's harness fingerprints outputs at return for the same
        reason (reference-kernels PR 104)."""
        time.sleep(0.05)  # a thread started by the last call gets the time to land its write
        if self.synchronize is not None:
            self.synchronize(self.device)
        for j, tensors in self.returned:
            record = self.result["samples"][j]
            keys = [leaf["key"] for leaf in record["output"]["leaves"] if "key" in leaf]
            for key, tensor in zip(keys, tensors, strict=False):
                if same_bits(tensor.detach().to("cpu"), self.outputs[key]):
                    continue
                later = [self.info["samples"][k]["id"] for k, kept in self.returned
                         if k > j and any(_same_memory(tensor, other) for other in kept)]
                record["changed_after_return"] = {"leaf": key, "overwritten_by": later}
                break
        self.check_environment("the late-write check")

    def refill(self, first_ok: int) -> None:
        """Batch-and-skip: call the candidate on one sample, then again on the *same* input tensors
        refilled in place with another sample's values (same shapes): work keyed on the buffers
        (their address, ``id()``) rather than on their values returns the first sample's result, or
        launches nothing. The parent judges the second output against the other sample's expected one."""
        samples = self.info["samples"]
        sample = samples[first_ok]
        ran = {k for k, _ in self.returned}
        others = [k for k, other in enumerate(samples) if k != first_ok and k in ran and other["state"] == sample["state"]
                  and _signature(other["args"], self.inputs) == _signature(sample["args"], self.inputs)]
        if not others:
            self.result["checks"]["refill"] = {"sample": sample["id"], "skipped": "no other sample has the same shapes"}
            return
        other = samples[others[0]]
        self.progress("refill", sample["id"])
        try:
            if self.model is not None:
                self.load_state(sample["state"])
            passed, run = self.prepare(sample)
            launches = [self.counter.count]
            run()
            self._sync()
            launches.append(self.counter.count)
            fresh = [decode_arg(a, self.inputs) for a in other["args"]]
            with torch.no_grad():
                for target, value in zip(pytree.tree_leaves(passed[:len(fresh)]), pytree.tree_leaves(fresh), strict=False):
                    if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
                        target.copy_(value)
            again = flatten_output(run(), "refill", self.outputs)
            self._sync()
            launches.append(self.counter.count)
            counted = self.counter.installed
            self.result["checks"]["refill"] = {
                "sample": sample["id"], "refilled_with": other["id"], "index": others[0], "output": again,
                "launches": [launches[1] - launches[0], launches[2] - launches[1]] if counted else None}
        except BaseException as error:
            self.result["checks"]["refill"] = {"sample": sample["id"], "refilled_with": other["id"],
                                               "error": error_text(error)}
        self.check_environment("the refill check")

    def repeat(self, first_ok: int, times: int) -> None:
        """Warm-up gaming: the first sample that ran, ``times`` more times on fresh copies of its
        inputs, each output against the first (and each call's Triton launches): a candidate honest
        for the calls a harness checks and not for the ones it times differs here."""
        sample = self.info["samples"][first_ok]
        first = self.result["samples"][first_ok]["output"]
        self.progress("repeat", sample["id"])
        differing: list[int] = []
        no_launch: list[int] = []
        worst = 0.0
        try:
            for n in range(1, times + 1):
                if self.model is not None:
                    self.load_state(sample["state"])
                _, run = self.prepare(sample)
                launches = self.counter.count
                scratch: dict[str, torch.Tensor] = {}
                again = flatten_output(run(), "repeat", scratch)
                self._sync()
                if self.counter.installed and self.counter.count == launches:
                    no_launch.append(n)
                diffs = [_leaf_difference(a, b, self.outputs, scratch)
                         for a, b in zip(first["leaves"], again["leaves"], strict=False)]
                if len(first["leaves"]) != len(again["leaves"]):
                    diffs.append(math.inf)
                if any(d != 0.0 for d in diffs):
                    differing.append(n)
                    worst = max(worst, *diffs)
            self.result["checks"]["repeat"] = {"sample": sample["id"], "calls": times, "differing_calls": differing,
                                               "max_abs_diff": worst, "calls_without_launch": no_launch}
        except BaseException as error:
            self.result["checks"]["repeat"] = {"sample": sample["id"], "calls": times, "error": error_text(error)}
        self.check_environment("the repeat check")

    def _sync(self) -> None:
        if self.synchronize is not None:
            self.synchronize(self.device)

    def determinism(self, first_ok: int) -> None:
        """Run the first sample that ran again and record how far the two results differ."""
        sample = self.info["samples"][first_ok]
        self.progress("determinism", sample["id"])
        try:
            _, run = self.prepare(sample)
            scratch: dict[str, torch.Tensor] = {}
            again = flatten_output(run(), "again", scratch)
            if self.synchronize is not None:
                self.synchronize(self.device)
            first = self.result["samples"][first_ok]["output"]
            diffs = [_leaf_difference(a, b, self.outputs, scratch)
                     for a, b in zip(first["leaves"], again["leaves"], strict=False)]
            if len(first["leaves"]) != len(again["leaves"]):
                diffs.append(math.inf)
            self.result["checks"]["determinism"] = {"sample": sample["id"], "identical": all(d == 0.0 for d in diffs),
                                                    "max_abs_diff": max(diffs, default=0.0)}
        except BaseException as error:
            self.result["checks"]["determinism"] = {"sample": sample["id"], "error": error_text(error)}
        self.check_environment("determinism")

    def trace(self, index: int) -> None:
        """Run sample ``index`` once more under an op trace (``kernel verify`` asks after it failed
        there, to name the first op that diverges): ``trace.json`` and its kept values."""
        sample = self.info["samples"][index]
        self.progress("trace", sample["id"])
        if self.model is not None:
            self.load_state(sample["state"])
        if isinstance(self.model, torch.nn.Module):
            self.model.train(sample["training"])
        _, run = self.prepare(sample)
        root = self.model if isinstance(self.model, torch.nn.Module) else torch.nn.Module()  # kernel_function: one region
        recorder = _op_trace.OpRecorder(root, stats=_shape_only.tensor_stats,
                                        limits=_op_trace.TraceLimits(values_bytes=int(self.spec["trace_values"])))
        output = None
        recorder.start()
        try:
            with torch.no_grad():  # as the reference runs its samples (worker_reference.py)
                output = run()
        except BaseException as error:
            self.result["trace_error"] = error_text(error)
        finally:
            trace = recorder.stop(output)
        values: dict[str, torch.Tensor] = {}
        keys: dict[int, str] = {}  # a module's output is its last op's: one tensor, stored once

        def keep(tensor: torch.Tensor, _path: str) -> str:
            if id(tensor) not in keys:
                keys[id(tensor)] = f"v{len(values)}"
                values[keys[id(tensor)]] = tensor
            return keys[id(tensor)]

        write_json(self.out_dir / "trace.json", {"trace": trace.to_json(keep), "error": recorder.error})
        save_tensors(self.out_dir / "trace.safetensors", values)
        self.check_environment("trace")

    def time_samples(self, timer: _timing.CudaTimer) -> None:
        for j, sample in enumerate(self.info["samples"]):
            record = self.result["samples"][j]
            if "output" not in record:
                continue
            self.progress("timing", sample["id"])
            if isinstance(self.model, torch.nn.Module):
                self.model.train(sample["training"])
            _, run = self.prepare(sample)
            launches = self.counter.count
            try:
                with torch.no_grad():  # as the reference is timed (worker_reference.py)
                    record["timing"] = timer.time(run, self.spec["warmup"], self.spec["trials"])
                    # the output of one more call on the timed inputs, against the checked one
                    scratch: dict[str, torch.Tensor] = {}
                    after = flatten_output(run(), "timed", scratch)
                    self._sync()
                record["timed_output_difference"] = max(
                    (_leaf_difference(a, b, self.outputs, scratch)
                     for a, b in zip(record["output"]["leaves"], after["leaves"], strict=False)), default=0.0)
            except BaseException as error:
                record["timing_error"] = error_text(error)
            if self.counter.installed:
                record["timing_launches"] = self.counter.count - launches
        self.check_environment("timing")


def run_candidate(spec: dict[str, Any]) -> int:
    """Candidate mode: run ModelNew / kernel_function on every sample, with runtime checks."""
    run = _CandidateRun(spec)
    if not run.load():
        return run.finish()
    if spec.get("trace_sample") is not None:  # only the trace of one sample (kernels/verify.py, _locate)
        run.trace(int(spec["trace_sample"]))
        return run.finish()
    first_ok = run.run_samples()
    if first_ok is not None:
        run.determinism(first_ok)
        run.refill(first_ok)
        run.repeat(first_ok, int(spec.get("repeat", 10)))
    run.late_writes()
    if run.timer is not None:
        run.time_samples(run.timer)
    run.progress("done")
    return run.finish()


def _mutated(passed: Sequence[object], originals: Sequence[object], names: list[str]) -> list[str]:
    """Names of the arguments whose tensors changed during the call."""
    changed = []
    for i, (value, original) in enumerate(zip(passed, originals, strict=True)):
        name = names[i] if i < len(names) else f"arg{i}"
        for (key_path, leaf), before in zip(pytree.tree_flatten_with_path(value)[0], pytree.tree_leaves(original),
                                            strict=False):
            if isinstance(before, torch.Tensor) and not (isinstance(leaf, torch.Tensor) and same_bits(leaf, before)):
                changed.append(name + pytree.keystr(key_path))
    return changed


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.numel() and b.numel()) and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _signature(args: Sequence[object], inputs: dict[str, torch.Tensor]) -> list[object]:
    """A sample's arguments as shapes and dtypes (tensors) and values (the rest)."""
    return [(tuple(leaf.shape), str(leaf.dtype)) if isinstance(leaf, torch.Tensor) else repr(leaf)
            for leaf in pytree.tree_leaves([decode_arg(a, inputs) for a in args])]


def _output_problems(output: object, device: torch.device) -> list[str]:
    problems = []
    for leaf in pytree.tree_leaves(output):
        if not isinstance(leaf, torch.Tensor):
            continue
        if type(leaf) not in (torch.Tensor, torch.nn.Parameter):
            problems.append(f"an output is a {type(leaf).__module__}.{type(leaf).__qualname__}, not a plain "
                            "torch.Tensor (tensor subclasses / lazy outputs are refused)")
        elif leaf.device.type != device.type:
            problems.append(f"an output is on {leaf.device}, not on {device}")
    return problems


def _leaf_difference(a: dict[str, Any], b: dict[str, Any], first: dict[str, torch.Tensor],
                     second: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two flattened output leaves (0.0 when bit-identical)."""
    return max_difference(first[a["key"]] if "key" in a else a.get("value"),
                          second[b["key"]] if "key" in b else b.get("value"))


def main(argv: list[str]) -> int:
    """``worker_candidate.py SPEC.json``; the spec file is deleted once read."""
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    spec_path.unlink()
    return run_candidate(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

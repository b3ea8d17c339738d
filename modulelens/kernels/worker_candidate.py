"""Candidate process of ``modulelens kernel verify`` (internal; ``python -P .../worker_candidate.py SPEC``).

Runs the candidate on the samples the reference process wrote. It runs as a plain script and
imports nothing from the modulelens package: its torch-only helpers (:mod:`.exchange`,
:mod:`modulelens.format.op_watch`, :mod:`modulelens.tools.timing`, and for a trace :mod:`modulelens.format.op_trace`
with the statistics of :mod:`modulelens.format.shape_only`) are loaded by file path before any
candidate code runs. It then blocks imports of modulelens and of the reference's own module, never holds
the reference module or any expected output, passes clones of the inputs and checks that they were
not modified, counts Triton launches, counts the heavy aten ops (matmul, convolution, attention)
the candidate's forward runs through PyTorch, watches threads and timer functions, and writes the
candidate's outputs. The parent process compares them.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import math
import sys
import threading
import time
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
    from modulelens.format import shape_only as _shape_only
    from modulelens.kernels import exchange as _exchange
    from modulelens.format import op_watch as _op_watch
    from modulelens.tools import timing as _timing
else:
    _exchange = _load_helper("_modulelens_kernel_exchange", _HERE / "exchange.py")
    _op_watch = _load_helper("_modulelens_op_watch", _HERE.parent / "format" / "op_watch.py")
    _timing = _load_helper("_modulelens_timing", _HERE.parent / "tools" / "timing.py")
    _shape_only = _load_helper("_modulelens_shape_only", _HERE.parent / "format" / "shape_only.py")
    _op_trace = _load_helper("_modulelens_op_trace", _HERE.parent / "format" / "op_trace.py")
decode_arg, flatten_output, same_bits = _exchange.decode_arg, _exchange.flatten_output, _exchange.same_bits
to_device, write_json, error_text = _exchange.to_device, _exchange.write_json, _exchange.error_text
load_tensors, save_tensors = _exchange.load_tensors, _exchange.save_tensors
OpCounter, CudaTimer = _op_watch.OpCounter, _timing.CudaTimer


class _ImportBlocker(importlib.abc.MetaPathFinder):
    """Refuses imports of the reference (modulelens, the module that defines the reference class)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        for name in self.names:
            if fullname == name or fullname.startswith(name + "."):
                raise ImportError(f"kernel candidates may not import {fullname} (it holds the reference)")
        return None


_TIMER_NAMES = ("time.perf_counter", "time.perf_counter_ns", "time.time", "time.monotonic", "torch.cuda.synchronize",
                "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
                "torch.cuda.Event.synchronize", "torch.cuda.current_stream", "torch.cuda.Stream")


def _lookup(dotted: str) -> Any:
    root, *rest = dotted.split(".")
    obj: Any = sys.modules.get(root)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


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


    def _counting(self, original: Any) -> Any:
        counter = self

        def run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("warmup", False):
                counter.count += 1
            return original(kernel, *args, **kwargs)

        return run


def _load_candidate(path: Path) -> Any:
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
        self.timers_before = {name: _lookup(name) for name in _TIMER_NAMES}
        self.info = json.loads((data_dir / "samples.json").read_text())
        self.inputs = load_tensors(data_dir / "inputs.safetensors")
        self.weights = load_tensors(data_dir / "weights.safetensors")
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.entry: Any = None
        self.model: Any = None

    def progress(self, phase: str, sample: str | None = None) -> None:
        write_json(self.out_dir / "progress.json", {"phase": phase, **({"sample": sample} if sample else {})})

    def check_environment(self, where: str) -> None:
        """Timer functions replaced, or threads left running, since the start."""
        patched = [n for n, obj in self.timers_before.items() if _lookup(n) is not obj]
        if patched:
            self.result["checks"].setdefault("timers_patched", {})[where] = patched
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
        record["output_problems"] = _output_problems(output, self.device)
        record["output"] = flatten_output(output, f"s{j}", self.outputs)
        self.check_environment(sample["id"])
        return True

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
            try:
                with torch.no_grad():  # as the reference is timed (worker_reference.py)
                    record["timing"] = timer.time(run, self.spec["warmup"], self.spec["trials"])
            except BaseException as error:
                record["timing_error"] = error_text(error)
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
    if run.timer is not None:
        run.time_samples(run.timer)
    run.progress("done")
    return run.finish()


def _mutated(passed: list[Any], originals: list[Any], names: list[str]) -> list[str]:
    """Names of the arguments whose tensors changed during the call."""
    changed = []
    for i, (value, original) in enumerate(zip(passed, originals, strict=True)):
        name = names[i] if i < len(names) else f"arg{i}"
        for (key_path, leaf), before in zip(pytree.tree_flatten_with_path(value)[0], pytree.tree_leaves(original),
                                            strict=False):
            if isinstance(before, torch.Tensor) and not (isinstance(leaf, torch.Tensor) and same_bits(leaf, before)):
                changed.append(name + pytree.keystr(key_path))
    return changed


def _output_problems(output: Any, device: torch.device) -> list[str]:
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
    if "key" not in a or "key" not in b:
        return 0.0 if a.get("value") == b.get("value") else math.inf
    x, y = first[a["key"]], second[b["key"]]
    if same_bits(x, y):
        return 0.0
    if x.shape != y.shape or x.numel() == 0:
        return math.inf
    if x.dtype.is_complex or y.dtype.is_complex:
        return float((x.to(torch.complex128) - y.to(torch.complex128)).abs().nan_to_num(nan=math.inf).max())
    return float((x.to(torch.float64) - y.to(torch.float64)).abs().nan_to_num(nan=math.inf).max())


def main(argv: list[str]) -> int:
    """``worker_candidate.py SPEC.json``; the spec file is deleted once read."""
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    spec_path.unlink()
    return run_candidate(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Subprocess worker of ``modulelens kernel verify`` (internal; not an API).

Each mode runs in a fresh process started by :mod:`modulelens.tools.kernel_verify`:

``reference`` (``python -m modulelens.tools._kernel_worker reference SPEC``)
    loads the capture, builds the samples (recorded calls plus seeded random inputs of the same
    shapes and dtypes), runs the restored reference module on them (timing it on CUDA), and writes
    the inputs, the weights and the reference outputs.
``candidate`` (``python -P .../_kernel_worker.py candidate SPEC``)
    runs the candidate on the same inputs. This mode runs as a plain script and imports nothing
    from modulelens; it blocks imports of modulelens and of the reference's own module, never holds
    the reference module or any expected output, passes clones of the inputs and checks that they
    were not modified, counts Triton launches, watches threads and timer functions, and writes the
    candidate's outputs. The parent process compares them.

The module also holds the tiny safetensors reader/writer shared by the exporter and both modes
(safetensors layout: 8-byte little-endian header length, JSON header, raw little-endian bytes).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import math
import os
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

# ------------------------------------------------------------------------------------ safetensors

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    name: dtype
    for name, dtype in (
        ("F64", torch.float64), ("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16),
        ("I64", torch.int64), ("I32", torch.int32), ("I16", torch.int16), ("I8", torch.int8),
        ("U8", torch.uint8), ("BOOL", torch.bool), ("C64", torch.complex64),
        ("U16", getattr(torch, "uint16", None)), ("U32", getattr(torch, "uint32", None)),
        ("U64", getattr(torch, "uint64", None)),
        ("F8_E4M3", getattr(torch, "float8_e4m3fn", None)), ("F8_E5M2", getattr(torch, "float8_e5m2", None)),
    )
    if isinstance(dtype, torch.dtype)
}
_SAFETENSORS_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def tensor_raw_bytes(tensor: torch.Tensor) -> bytes:
    """The elements of ``tensor`` as little-endian bytes, row-major, no header."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def write_safetensors(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` as a .safetensors file (no pickle; readable by the ``safetensors`` package)."""
    header: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        dtype_name = _SAFETENSORS_NAMES.get(tensor.dtype)
        if dtype_name is None:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors encoding")
        data = tensor_raw_bytes(tensor)
        header[name] = {"dtype": dtype_name, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = Path(f"{os.fspath(path)}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
        for chunk in chunks:
            handle.write(chunk)
    os.replace(tmp, path)


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a .safetensors file into ``{name: tensor}`` (each tensor owns its memory)."""
    raw = Path(path).read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    base = 8 + size
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = (base + o for o in info["data_offsets"])
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        flat = torch.frombuffer(bytearray(raw[start:end]), dtype=dtype) if end > start else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(info["shape"])
    return out


# ------------------------------------------------------------------------------------ arguments as JSON


def encode_arg(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A call argument as JSON; tensors go into ``tensors`` under ``key`` (nested: ``key.i``)."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach()
        return {"t": key}
    if value is None or isinstance(value, (bool, int, str)):
        return {"v": value}
    if isinstance(value, float):
        return {"v": value} if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if type(value) in (list, tuple):
        return {type(value).__name__: [encode_arg(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]}
    if type(value) is dict and all(isinstance(k, (str, int)) for k in value):
        return {"dict": [[k, encode_arg(v, f"{key}.{k}", tensors)] for k, v in value.items()]}
    raise ValueError(f"argument {key}: a {type(value).__module__}.{type(value).__qualname__} cannot be passed")


def decode_arg(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`encode_arg`."""
    if "t" in data:
        return tensors[data["t"]]
    if "v" in data:
        return data["v"]
    if "float" in data:
        return float(data["float"])
    if "dtype" in data:
        return getattr(torch, data["dtype"])
    if "device" in data:
        return torch.device(data["device"])
    if "size" in data:
        return torch.Size(data["size"])
    if "list" in data:
        return [decode_arg(v, tensors) for v in data["list"]]
    if "tuple" in data:
        return tuple(decode_arg(v, tensors) for v in data["tuple"])
    if "dict" in data:
        return {k: decode_arg(v, tensors) for k, v in data["dict"]}
    raise ValueError(f"unknown argument encoding {data!r}")


def to_device(tree: Any, device: torch.device) -> Any:
    """A private copy of every tensor in ``tree`` on ``device``."""
    return pytree.tree_map(
        lambda v: v.detach().to(device, copy=True) if isinstance(v, torch.Tensor) else v, tree)


def flatten_output(output: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """An output tree as ``{"spec", "leaves"}``; tensor leaves are copied to CPU into ``tensors``."""
    leaves_with_paths, spec = pytree.tree_flatten_with_path(output)
    leaves = []
    for n, (key_path, leaf) in enumerate(leaves_with_paths):
        path = "output" + pytree.keystr(key_path)
        if isinstance(leaf, torch.Tensor):
            key = f"{prefix}.out{n}"
            tensors[key] = leaf.detach().to("cpu").clone()
            leaves.append({"path": path, "key": key, "type": type(leaf).__name__,
                           "device": str(leaf.device), "dtype": str(leaf.dtype).removeprefix("torch.")})
        else:
            try:
                json.dumps(leaf)
                value: Any = leaf
            except (TypeError, ValueError):
                value = {"repr": repr(leaf)[:200]}
            leaves.append({"path": path, "value": value, "type": type(leaf).__name__})
    return {"spec": str(spec), "leaves": leaves}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8),
                       b.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8))


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _error_text(error: BaseException) -> str:
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    tail = "".join(lines[-6:]).strip()
    return f"{type(error).__name__}: {error}"[:500] + ("\n" + tail[-1500:] if tail else "")


# ------------------------------------------------------------------------------------ timing


class CudaTimer:
    """CUDA-event timing with an L2 flush before every trial.

    The end event is recorded after a device-wide synchronize, so work a candidate queues on
    other streams is counted (this adds the same few microseconds to reference and candidate).
    The functions are bound when the timer is built, before any candidate code is imported.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.event = torch.cuda.Event
        self.record = torch.cuda.Event.record
        self.elapsed = torch.cuda.Event.elapsed_time
        self.synchronize = torch.cuda.synchronize
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (256 << 20)
        self.flush_buffer = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
        self.flush_bytes = self.flush_buffer.numel() * 4

    def time(self, fn: Any, warmup: int, trials: int) -> dict[str, Any]:
        for _ in range(warmup):
            fn()
        self.synchronize(self.device)
        times = []
        for _ in range(trials):
            self.flush_buffer.zero_()
            self.synchronize(self.device)
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            self.record(start)
            fn()
            self.synchronize(self.device)
            self.record(end)
            self.synchronize(self.device)
            times.append(float(self.elapsed(start, end)))
        return timing_stats(times, warmup)


def timing_stats(times_ms: list[float], warmup: int) -> dict[str, Any]:
    ordered = sorted(times_ms)
    n = len(ordered)
    mean = sum(ordered) / n
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    std = math.sqrt(sum((t - mean) ** 2 for t in ordered) / (n - 1)) if n > 1 else 0.0
    return {"mean_ms": mean, "median_ms": median, "std_ms": std, "min_ms": ordered[0], "max_ms": ordered[-1],
            "trials": n, "warmup": warmup}


# ------------------------------------------------------------------------------------ reference mode


def _randomize(value: Any, generator: torch.Generator, path: str, notes: list[dict[str, str]]) -> Any:
    """Random values with the shape and dtype of a recorded argument (see docs/kernels.md)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        if t.numel() == 0:
            notes.append({"arg": path, "how": "kept (empty)"})
            return t.clone()
        if t.dtype.is_floating_point or t.dtype.is_complex:
            work = t.to(torch.complex128 if t.dtype.is_complex else torch.float64)
            finite = work[torch.isfinite(work)] if not t.dtype.is_complex else work.reshape(-1)
            mean = float(finite.real.mean()) if finite.numel() else 0.0
            std = float(finite.real.std()) if finite.numel() > 1 else abs(mean)
            if not math.isfinite(std) or std == 0.0:
                std = abs(mean) or 1.0
            noise = torch.randn(t.shape, generator=generator, dtype=work.dtype)
            notes.append({"arg": path, "how": f"normal(mean={mean:.4g}, std={std:.4g})"})
            return (noise * std + mean).to(t.dtype)
        if t.dtype == torch.bool:
            p = float(t.to(torch.float64).mean())
            notes.append({"arg": path, "how": f"bernoulli(p={p:.3g})"})
            return torch.rand(t.shape, generator=generator, dtype=torch.float64) < p
        flat = t.reshape(-1)
        if t.dim() == 1 and t.numel() > 1 and bool((flat[1:] >= flat[:-1]).all()):
            notes.append({"arg": path, "how": "kept (sorted integers: offsets-like)"})
            return t.clone()
        lo, hi = int(flat.min()), int(flat.max())
        notes.append({"arg": path, "how": f"uniform integers in [{lo}, {hi}]"})
        return torch.randint(lo, hi + 1, t.shape, generator=generator, dtype=torch.int64).to(t.dtype)
    if type(value) in (list, tuple):
        items = [_randomize(v, generator, f"{path}[{i}]", notes) for i, v in enumerate(value)]
        return type(value)(items)
    if type(value) is dict:
        return {k: _randomize(v, generator, f"{path}[{k!r}]", notes) for k, v in value.items()}
    return value


def run_reference(spec: dict[str, Any]) -> int:
    """Reference mode: samples, reference outputs and reference timing."""
    from modulelens.restore.loader import load
    from modulelens.restore.replay import call_context
    from modulelens.tools.export_kernelbench import bind_calls, select_calls

    out_dir = Path(spec["out_dir"])
    device = torch.device(spec["device"])
    capture = load(spec["ref"], repo=spec["repo"], device=device)
    positions = select_calls(capture, spec.get("calls"), spec["max_calls"], same_state=False)
    binding = bind_calls(capture, positions)
    module = capture.module
    timer = CudaTimer(device) if spec.get("timing") and device.type == "cuda" else None
    inputs: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    samples: list[dict[str, Any]] = []
    plan: list[tuple[str, str, int, Any, list[dict[str, str]]]] = []
    for position in positions:
        plan.append((f"call {capture.calls[position].index}", "recorded", position, binding.positional[position], []))
    for j in range(spec["random"]):
        position = positions[j % len(positions)]
        generator = torch.Generator().manual_seed(int(spec["seed"]) * 1000 + j)
        notes: list[dict[str, str]] = []
        args = [_randomize(value, generator, name, notes)
                for value, name in zip(binding.positional[position], binding.names, strict=True)]
        plan.append((f"random {j}", "random", position, args, notes))
    for j, (sample_id, kind, position, args, notes) in enumerate(plan):
        call = capture.calls[position]
        prefix = f"s{j}"
        encoded = [encode_arg(a, f"{prefix}.a{i}", inputs) for i, a in enumerate(args)]
        entry: dict[str, Any] = {"id": sample_id, "kind": kind, "position": position, "call_index": call.index,
                                 "state": call.state_index, "training": call.training, "args": encoded,
                                 "randomized": notes, "reference": {}}
        samples.append(entry)
        capture.use_state(call.state_index)  # reloads too when a call changed a buffer in place
        module.train(call.training)

        def run_once(args: Any = args, call: Any = call) -> Any:
            positional = to_device(list(args), device)
            n = len(positional) - len(binding.kw_names)
            with call_context(call, device), torch.no_grad():
                out = module(*positional[:n], **dict(zip(binding.kw_names, positional[n:], strict=True)))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out

        try:
            output = run_once()
            entry["reference"] = flatten_output(output, prefix, expected)
            if kind == "random":
                scratch: dict[str, torch.Tensor] = {}
                again = flatten_output(run_once(), prefix + "again", scratch)
                deterministic = all(
                    same_bits(expected[a["key"]], scratch[b["key"]]) if "key" in a and "key" in b
                    else a.get("value") == b.get("value")
                    for a, b in zip(entry["reference"]["leaves"], again["leaves"], strict=False))
                entry["reference"]["deterministic"] = deterministic
                if not deterministic:
                    entry["skip"] = "the reference module is not deterministic on this input"
            if timer is not None:
                positional = to_device(list(args), device)
                n = len(positional) - len(binding.kw_names)
                kwargs = dict(zip(binding.kw_names, positional[n:], strict=True))
                with torch.no_grad():
                    entry["reference"]["timing"] = timer.time(
                        lambda p=positional[:n], k=kwargs: module(*p, **k), spec["warmup"], spec["trials"])
        except Exception as error:  # the reference failing on a random input is reported, not fatal
            entry["reference"]["error"] = _error_text(error)
            if kind == "random":
                entry["skip"] = "the reference module raised on this input"
    weights: dict[str, torch.Tensor] = {}
    states = sorted({s["state"] for s in samples})
    for index in states:
        for name, tensor in _state_tensors(capture, index).items():
            weights[f"state{index}.{name}"] = tensor
    write_safetensors(out_dir / "inputs.safetensors", inputs)
    write_safetensors(out_dir / "weights.safetensors", weights)
    write_safetensors(out_dir / "expected.safetensors", expected)
    info = {
        "ref": capture.ref, "device": str(device), "samples": samples, "states": states,
        "weight_names": binding.weight_names, "arg_names": binding.names, "kw_names": binding.kw_names,
        "init_inputs": binding.init_inputs, "notes": capture.notes + binding.notes,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "l2_flush_bytes": timer.flush_bytes if timer else None,
    }
    _write_json(out_dir / "reference.json", info)
    return 0


def _state_tensors(capture: Any, index: int) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (persistent or not) of one recorded state, by name."""
    states = capture.metadata.get("states", [])
    if not states:
        return {}
    state = states[index]
    result = {n: capture.tensor(e["tensor"]) for n, e in state["parameters"].items()}
    result.update({n: capture.tensor(e["tensor"]) for n, e in state["buffers"].items()})
    return result


# ------------------------------------------------------------------------------------ candidate mode


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
        classes: list[type] = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except Exception:
            pass
        for cls in classes:
            cls.run = self._counting(cls.run)  # type: ignore[method-assign]
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


def run_candidate(spec: dict[str, Any]) -> int:
    """Candidate mode: run ModelNew / kernel_function on every sample, with runtime checks."""
    out_dir = Path(spec["out_dir"])
    data_dir = Path(spec["data_dir"])
    device = torch.device(spec["device"])
    progress = out_dir / "progress.json"
    result: dict[str, Any] = {"entry": None, "samples": [], "weights": {}, "checks": {}, "timing": {}}
    _write_json(progress, {"phase": "setup"})
    for name in list(sys.modules):
        if any(name == b or name.startswith(b + ".") for b in spec["blocked_modules"]):
            del sys.modules[name]
    sys.meta_path.insert(0, _ImportBlocker(spec["blocked_modules"]))
    counter = _LaunchCounter()
    if spec.get("count_triton_launches"):
        counter.install()
    result["checks"]["triton_launches_counted"] = counter.installed
    timer = CudaTimer(device) if spec.get("timing") and device.type == "cuda" else None
    synchronize = torch.cuda.synchronize if device.type == "cuda" else None
    timers_before = {name: _lookup(name) for name in _TIMER_NAMES}
    info = json.loads((data_dir / "samples.json").read_text())
    inputs = read_safetensors(data_dir / "inputs.safetensors")
    weights = read_safetensors(data_dir / "weights.safetensors")
    threads_before = {t.ident for t in threading.enumerate()}

    def check_environment(where: str) -> None:
        patched = [n for n, obj in timers_before.items() if _lookup(n) is not obj]
        if patched:
            result["checks"].setdefault("timers_patched", {})[where] = patched
        extra = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
        if extra:
            result["checks"].setdefault("threads_left_running", {})[where] = extra

    def finish(code: int) -> int:
        _write_json(out_dir / "candidate.json", result)
        write_safetensors(out_dir / "outputs.safetensors", outputs)
        return code

    outputs: dict[str, torch.Tensor] = {}
    _write_json(progress, {"phase": "import"})
    try:
        module = _load_candidate(Path(spec["candidate"]))
    except BaseException as error:
        result["load_error"] = _error_text(error)
        return finish(0)
    check_environment("import")
    entry_name = spec.get("entry", "auto")
    if entry_name == "auto":
        entry_name = "ModelNew" if isinstance(getattr(module, "ModelNew", None), type) else "kernel_function"
    entry = getattr(module, entry_name, None)
    result["entry"] = entry_name
    if entry is None or not callable(entry):
        result["load_error"] = f"the candidate defines no {entry_name} (expected class ModelNew or def kernel_function)"
        return finish(0)
    model: Any = None
    loaded_state: int | None = None
    if entry_name == "ModelNew":
        _write_json(progress, {"phase": "construct ModelNew"})
        try:
            torch.manual_seed(int(spec["seed"]))
            with torch.no_grad():
                model = entry(*info["init_inputs"])
            model = model.to(device) if isinstance(model, torch.nn.Module) else model
        except BaseException as error:
            result["load_error"] = f"ModelNew(*init_inputs) failed: {_error_text(error)}"
            return finish(0)
        check_environment("construct")

    def load_state(index: int) -> None:
        own: dict[str, torch.Tensor] = {}
        if isinstance(model, torch.nn.Module):
            own.update(model.named_parameters(remove_duplicate=False))
            own.update(model.named_buffers(remove_duplicate=False))
        loaded, missing, mismatched = [], [], []
        prefix = f"state{index}."
        with torch.no_grad():
            for key, value in weights.items():
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
        result["weights"] = {"loaded": loaded, "missing": missing, "mismatched": mismatched}

    def prepare(args: list[Any], state: int) -> tuple[list[Any], Any]:
        """Everything the entry point is called with, and a function that makes the call."""
        if model is not None:
            return list(args), lambda: model(*args)
        extra = [to_device(weights[f"state{state}.{n}"], device) for n in info["weight_names"]]
        everything = list(args) + extra
        return everything, lambda: entry(*everything)

    names = list(info["arg_names"]) + ([] if model is not None else list(info["weight_names"]))
    has_buffers = isinstance(model, torch.nn.Module) and any(True for _ in model.buffers())
    first_ok: int | None = None
    for j, sample in enumerate(info["samples"]):
        record: dict[str, Any] = {"id": sample["id"]}
        result["samples"].append(record)
        _write_json(progress, {"phase": "call", "sample": sample["id"]})
        if sample.get("skip"):
            record["skipped"] = sample["skip"]
            continue
        if model is not None and (loaded_state != sample["state"] or has_buffers):
            load_state(sample["state"])  # reloaded every call when there are buffers: a call may change them
            loaded_state = sample["state"]
        if isinstance(model, torch.nn.Module):
            model.train(sample["training"])
        passed, run = prepare(to_device([decode_arg(a, inputs) for a in sample["args"]], device), sample["state"])
        originals = [to_device(v, torch.device("cpu")) for v in passed]
        launches = counter.count
        try:
            start = time.perf_counter()
            output = run()
            if synchronize is not None:
                synchronize(device)
            record["seconds"] = time.perf_counter() - start
        except BaseException as error:
            record["error"] = _error_text(error)
            check_environment(sample["id"])
            continue
        record["triton_launches"] = counter.count - launches if counter.installed else None
        record["mutated_inputs"] = _mutated(passed, originals, names)
        record["output_problems"] = _output_problems(output, device)
        record["output"] = flatten_output(output, f"s{j}", outputs)
        check_environment(sample["id"])
        if first_ok is None:
            first_ok = j
    if first_ok is not None:
        sample = info["samples"][first_ok]
        _write_json(progress, {"phase": "determinism", "sample": sample["id"]})
        try:
            _, run = prepare(to_device([decode_arg(a, inputs) for a in sample["args"]], device), sample["state"])
            scratch: dict[str, torch.Tensor] = {}
            again = flatten_output(run(), "again", scratch)
            if synchronize is not None:
                synchronize(device)
            first = result["samples"][first_ok]["output"]
            diffs = [_leaf_difference(a, b, outputs, scratch) for a, b in zip(first["leaves"], again["leaves"], strict=False)]
            if len(first["leaves"]) != len(again["leaves"]):
                diffs.append(math.inf)
            result["checks"]["determinism"] = {"sample": sample["id"], "identical": all(d == 0.0 for d in diffs),
                                               "max_abs_diff": max(diffs, default=0.0)}
        except BaseException as error:
            result["checks"]["determinism"] = {"sample": sample["id"], "error": _error_text(error)}
        check_environment("determinism")
    if timer is not None:
        for j, sample in enumerate(info["samples"]):
            record = result["samples"][j]
            if "output" not in record:
                continue
            _write_json(progress, {"phase": "timing", "sample": sample["id"]})
            _, run = prepare(to_device([decode_arg(a, inputs) for a in sample["args"]], device), sample["state"])
            try:
                record["timing"] = timer.time(run, spec["warmup"], spec["trials"])
            except BaseException as error:
                record["timing_error"] = _error_text(error)
        check_environment("timing")
    _write_json(progress, {"phase": "done"})
    return finish(0)


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
    """``_kernel_worker.py {reference|candidate} SPEC.json``; the spec file is deleted once read."""
    mode, spec_path = argv[0], Path(argv[1])
    spec = json.loads(spec_path.read_text())
    spec_path.unlink()
    if mode == "reference":
        return run_reference(spec)
    if mode == "candidate":
        return run_candidate(spec)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

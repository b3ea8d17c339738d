"""What the kernel verifier's processes pass each other: call arguments as JSON plus tensor files.

Samples cross process boundaries as JSON (``encode_arg``/``decode_arg``; tensors go into a
safetensors file under a key) and outputs come back flattened (``flatten_output``). The candidate
worker loads this file by path before any candidate code runs, so it imports torch and the
standard library only.
"""

from __future__ import annotations

import json
import math
import os
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree

T = TypeVar("T")


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as JSON atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """What a worker process wrote with :func:`write_json`, or ``None`` when it wrote nothing
    readable (it died first, or was killed mid-way)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def error_text(error: BaseException) -> str:
    """``Type: message`` and the last frames of the traceback, bounded in size."""
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    tail = "".join(lines[-6:]).strip()
    return f"{type(error).__name__}: {error}"[:500] + ("\n" + tail[-1500:] if tail else "")


def encode_arg(value: object, key: str, tensors: dict[str, torch.Tensor]) -> dict[str, object]:
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
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
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


def to_device(tree: T, device: torch.device) -> T:
    """A private copy of every tensor in ``tree`` on ``device``."""
    return pytree.tree_map(
        lambda v: v.detach().to(device, copy=True) if isinstance(v, torch.Tensor) else v, tree)


def flatten_output(output: object, prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
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


# bound when this file loads, before any candidate code runs: a candidate that replaces torch.equal
# (to blind the input-mutation check) does not reach this one
_equal = torch.equal


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return _equal(a.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8),
                  b.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8))


def max_difference(x: object, y: object) -> float:
    """The largest absolute difference between two output leaves (tensors or plain values): 0.0 when
    bit-identical (equal), inf for another shape, a NaN against a number, or unequal plain values."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return 0.0 if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor) and x == y else math.inf
    if same_bits(x, y):
        return 0.0
    if x.shape != y.shape or x.numel() == 0:
        return math.inf
    wide = torch.complex128 if x.dtype.is_complex or y.dtype.is_complex else torch.float64
    return float((x.detach().to("cpu", wide) - y.detach().to("cpu", wide)).abs().nan_to_num(nan=math.inf).max())


def aliased_inputs(output: object, named: Sequence[tuple[str, object]]) -> list[str]:
    """The names in ``named`` (``(name, value)``, values possibly nested) whose tensors share memory
    with a tensor of ``output``: an output that aliases an input (or a weight) changes when it does."""
    storages = {leaf.untyped_storage().data_ptr() for leaf in pytree.tree_leaves(output)
                if isinstance(leaf, torch.Tensor) and leaf.numel()}
    found = []
    for name, value in named:
        if any(isinstance(leaf, torch.Tensor) and leaf.numel() and leaf.untyped_storage().data_ptr() in storages
               for leaf in pytree.tree_leaves(value)):
            found.append(name)
    return found


def save_tensors(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` as a .safetensors file (no pickle), atomically.

    Each tensor is copied to a contiguous CPU tensor of its own: safetensors refuses tensors that
    share memory (tied weights, several views of one input)."""
    from safetensors.torch import save_file

    tmp = Path(f"{os.fspath(path)}.tmp{os.getpid()}")
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)


def load_tensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a .safetensors file into ``{name: tensor}`` (CPU tensors)."""
    from safetensors.torch import load_file

    return load_file(str(path))

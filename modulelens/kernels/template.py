"""Text templates of the exported KernelBench problem (``problem.py``) and KernelAgent test.

Placeholders are ``@@NAME@@`` (no ``str.format``, so the Python braces stay as they are); the
exporter fills them in :mod:`modulelens.kernels.export`. The generated files must stay
self-contained: torch and the standard library only, data read from ``data/`` next to the file (else
the exported absolute path; ``$MODULELENS_PROBLEM_DATA`` overrides both), no pickle.
"""

from __future__ import annotations

import re

DATA_ENV = "MODULELENS_PROBLEM_DATA"

# The safetensors reader shared by both generated files (a few lines, so an LLM can read it).
READER = '''
def _ml_read_safetensors(path):
    """Read a .safetensors file into {name: tensor}: 8-byte header size, JSON header, raw bytes."""
    raw = Path(path).read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
              "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = (8 + size + offset for offset in info["data_offsets"])
        dtype = dtypes[info["dtype"]]
        flat = torch.frombuffer(bytearray(raw[start:end]), dtype=dtype) if end > start else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return tensors
'''.strip("\n")

PROBLEM = '''"""KernelBench problem exported by modulelens from the captured module @@REF@@.

Module: @@CLASS@@ (captured as '@@QUALNAME@@'), @@CALL_COUNT@@ recorded call(s) of the real job.
`Model` is that module with its REAL captured weights; `get_inputs()` returns the REAL inputs of
one recorded call, picked with torch's random generator (KernelBench seeds it before each trial).
The data is in DATA_DIR as .safetensors files; set $@@DATA_ENV@@ to read it elsewhere.

Write `ModelNew` with the same constructor and forward arguments as `Model`. KernelBench does not
copy weights from Model to ModelNew: give ModelNew the same parameters and buffers (same names and
shapes) and load them with `_ml_load_weights(self)` (copy the two helpers below).
Check a candidate on the recorded calls and on random inputs:
    modulelens kernel verify @@REF@@ --candidate my_kernel.py
"""
@@FUTURE@@
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

# $@@DATA_ENV@@, else data/ next to this file, else (exec'd from its text with no __file__, as
# KernelBench loads problems; or copied away from its data) the folder it was exported to.
_ML_HERE = Path(globals()["__file__"]).parent / "data" if "__file__" in globals() else None
DATA_DIR = Path(os.environ.get("@@DATA_ENV@@") or (
    _ML_HERE if _ML_HERE is not None and (_ML_HERE / "weights.safetensors").is_file() else @@DATA_DIR@@))

@@READER@@


def _ml_load_weights(module, path=None):
    """Copy the captured parameters and buffers into `module`, by name (as named_parameters names them)."""
    tensors = _ml_read_safetensors(path or DATA_DIR / "weights.safetensors")
    own = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for name, value in tensors.items():
            if name in own:
                own[name].copy_(value)
            else:  # a buffer its parent registered after construction (Falcon-H1's mamba.mup_vector)
                owner, _, leaf = name.rpartition(".")
                module.get_submodule(owner).register_buffer(leaf, value.clone(), persistent=False)


# Classes look their module up in sys.modules (typing.get_type_hints in transformers' PreTrainedModel,
# dataclasses): exec'd from its text, as KernelBench loads problems, this file is no module, so its
# globals are registered as one.
if getattr(sys.modules.get(globals().get("__name__", "")), "__dict__", None) is not globals():
    class _MLModule:
        pass

    _ml_module = _MLModule()
    _ml_module.__dict__ = globals()
    __name__ = f"modulelens_problem_{id(_ml_module):x}"
    sys.modules[__name__] = _ml_module

# ---------------------------------------------------------------- captured module source
@@SOURCE@@
# ---------------------------------------------------------------- end of captured module source

_Captured = @@CLASS_EXPR@@


class Model(_Captured):
    """@@CLASS_SHORT@@ built with its recorded constructor arguments and the captured weights."""

    def __init__(self, *init_inputs):
@@INIT_BODY@@
@@FORWARD@@

def get_init_inputs():
    """Positional constructor arguments recorded by modulelens."""
    return @@INIT_INPUTS@@


# Positional forward arguments of each recorded call (keyword arguments bound to their positions).
_ML_CALLS = [
@@CALLS@@
]


def get_inputs():
    """Forward arguments of one recorded call, chosen with torch's RNG (seed it first)."""
    choice = int(torch.randint(len(_ML_CALLS), (1,))) if len(_ML_CALLS) > 1 else 0
    return _ML_CALLS[choice](_ml_read_safetensors(DATA_DIR / "inputs.safetensors"))


def get_benchmark_config():
    """Timing settings read by KernelAgent's benchmark (triton.testing.do_bench budgets, ms)."""
    return {"warmup": 25, "repeat": 100}
'''

TEST = '''"""modulelens test for KernelAgent (`--test-paths`): kernel_function on the REAL recorded calls of @@REF@@.

Calling convention (every recorded call of @@CLASS_SHORT@@.forward):
    @@SIGNATURE@@
that is the forward arguments (positional), then the module's parameters and buffers in this order:
@@WEIGHT_LINES@@
It returns what forward returns: @@OUTPUT_DESC@@.
Tolerance (|got - want| <= atol + rtol * |want|): @@TOLERANCE_DESC@@.
Inputs must not be modified. Prints PASS and exits 0 when every recorded call matches, else exits 1.
The data is read by absolute path (set $@@DATA_ENV@@ to move it); no CUDA: Triton runs in its interpreter.
"""

import json
import os
import sys
import traceback
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported

# $@@DATA_ENV@@, else data/ next to this file, else (exec'd from its text with no __file__, as
# KernelBench loads problems; or copied away from its data) the folder it was exported to.
_ML_HERE = Path(globals()["__file__"]).parent / "data" if "__file__" in globals() else None
DATA_DIR = Path(os.environ.get("@@DATA_ENV@@") or (
    _ML_HERE if _ML_HERE is not None and (_ML_HERE / "weights.safetensors").is_file() else @@DATA_DIR@@))
TOLERANCES = @@TOLERANCES@@
WEIGHT_NAMES = @@WEIGHT_NAMES@@
# Per recorded call: its positional forward arguments, and its expected output leaves.
CALLS = [
@@CALLS@@
]
EXPECTED = @@EXPECTED@@

@@READER@@


def _to(value, device):
    return torch.utils._pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def _check_leaf(call, path, want, got):
    if not isinstance(want, torch.Tensor):
        if want != got:
            print(f"call {call} {path}: expected {want!r}, got {got!r}")
            return False
        return True
    if not isinstance(got, torch.Tensor):
        print(f"call {call} {path}: expected a tensor, got {type(got).__name__}")
        return False
    if got.shape != want.shape or got.dtype != want.dtype:
        print(f"call {call} {path}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}")
        return False
    got = got.detach().cpu()
    if not want.dtype.is_floating_point:
        bad = int((got != want).sum())
        if bad:
            print(f"call {call} {path}: {bad}/{want.numel()} elements differ (exact match required)")
        return bad == 0
    rtol, atol = TOLERANCES[str(want.dtype).replace("torch.", "")]
    w, g = want.double(), got.double()
    diff = (g - w).abs()
    bad = (diff > atol + rtol * w.abs()) | (torch.isnan(w) != torch.isnan(g))
    count = int(bad.sum())
    if count:
        print(f"call {call} {path}: {count}/{want.numel()} elements differ (rtol={rtol:g}, atol={atol:g}); "
              f"max abs error {float(diff.nan_to_num(0.0).max()):.3g}")
    return count == 0


def _unchanged(x, y):
    x = x.detach().cpu()
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if torch.equal(x, y):
        return True
    return y.is_floating_point() and torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(0.0), y.nan_to_num(0.0))


def test_kernel():
    try:
        from kernel import kernel_function
    except Exception:
        traceback.print_exc()
        return False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = _ml_read_safetensors(DATA_DIR / "inputs.safetensors")
    weights = _ml_read_safetensors(DATA_DIR / "weights.safetensors")
    outputs = _ml_read_safetensors(DATA_DIR / "outputs.safetensors")
    ok = True
    for call, build in enumerate(CALLS):
        args = _to(build(inputs), device) + [weights[name].to(device) for name in WEIGHT_NAMES]
        before = [torch.utils._pytree.tree_map(
            lambda v: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v, a) for a in args]
        try:
            result = kernel_function(*args)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception:
            traceback.print_exc()
            print(f"call {call}: kernel_function raised")
            ok = False
            continue
        # None and objects (a cache) are not compared: only tensors and plain values
        got = [g for g in torch.utils._pytree.tree_leaves(result)
               if isinstance(g, (torch.Tensor, bool, int, float, str))]
        want = [outputs[leaf["key"]] if "key" in leaf else leaf["value"] for leaf in EXPECTED[call]]
        if len(got) != len(want):
            print(f"call {call}: {len(got)} output value(s), expected {len(want)}")
            ok = False
            continue
        for leaf, w, g in zip(EXPECTED[call], want, got):
            ok = _check_leaf(call, leaf["path"], w, g) and ok
        for i, (a, b) in enumerate(zip(args, before)):
            for x, y in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)):
                if isinstance(y, torch.Tensor) and not _unchanged(x, y):
                    print(f"call {call}: argument {i} was modified in place")
                    ok = False
    return ok


if __name__ == "__main__":
    passed = test_kernel()
    print("PASS" if passed else "FAIL")
    sys.exit(0 if passed else 1)
'''


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every ``@@KEY@@`` placeholder of ``template`` (each must be given; values are not rescanned)."""
    wanted = set(re.findall(r"@@([A-Z_]+)@@", template))
    missing = wanted - set(values)
    if missing:
        raise KeyError(f"template placeholders without a value: {sorted(missing)}")
    return re.sub(r"@@([A-Z_]+)@@", lambda m: values[m.group(1)], template)

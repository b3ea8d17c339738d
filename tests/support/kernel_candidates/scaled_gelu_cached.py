"""A cheat: returns the recorded output of call 0 read from the exported problem's data folder."""
# ruff: noqa: N803 - Triton style: uppercase sizes and constexpr block names

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

DATA = "@DATA@"


@triton.jit
def _copy(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def kernel_function(x, scale, shift):
    raw = Path(DATA + "/outputs.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + size])["call0.out0"]
    start, end = (8 + size + o for o in info["data_offsets"])
    cached = torch.frombuffer(bytearray(raw[start:end]), dtype=torch.float32).reshape(info["shape"])
    out = torch.empty_like(cached)
    _copy[(triton.cdiv(out.numel(), 256),)](cached, out, out.numel(), BLOCK=256)
    return out

"""The dtype names capture metadata may use and their sizes (torch-free: the metadata checker and
the repo read captures without importing torch)."""

from __future__ import annotations

# Stable names for dtypes in the metadata (the short names torch itself prints) -> bytes per element.
DTYPE_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    # format 2: quantized tensors (their payload is the integer representation, docs/format.md)
    "qint8": 1, "quint8": 1, "qint32": 4,
}
# The integer dtype holding a quantized dtype's values (``Tensor.int_repr()``).
QUANTIZED_STORAGE: dict[str, str] = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}


def can_require_grad(dtype: str) -> bool:
    """Whether a tensor of ``dtype`` may require gradients (torch allows floating point and complex only)."""
    return dtype.startswith(("float", "bfloat", "complex"))

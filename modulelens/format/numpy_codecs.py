"""Codecs for numpy arrays and scalars, installed lazily by :mod:`modulelens.format.values` once
the job has imported numpy.

Reinforcement-learning policies take and return them (stable-baselines3's ``policy.predict(obs)``:
a numpy observation in, numpy actions out), as do audio front ends and data pipelines: without a
codec each was an ``unrecorded`` marker, and replay could not run the call. An array is stored as
its values, one tensor in the capture's tensor table (raw bytes, like any tensor: no pickle), and
rebuilt as a new numpy array of the same dtype and shape. It is a state codec (docs/codecs.md): a
module may fill an array it was given, so it is recorded again after the call, and replay compares
the values element by element under the tensor rules, not with ``==``.

Only what a tensor holds is stored: booleans, integers, floats and complex numbers in the machine's
byte order (an array in the other order is stored in this one). Object, string, datetime and
``longdouble`` arrays are ``unrecorded`` markers naming their dtype (a constructor argument fails
naming it). Subclasses of
``ndarray`` (masked arrays, ``matrix``) are not served: what they add to the values would be lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from modulelens.errors import UnsupportedValueError, UntrustedCodeError
from modulelens.format.values import Unrecorded, register_state_codec

if TYPE_CHECKING:
    import numpy as np

ARRAY_CODEC = "numpy.ndarray"
SCALAR_CODEC = "numpy.generic"
_STORED_KINDS = "biufc"  # bool, signed and unsigned integers, floats, complex: what torch.from_numpy takes


def _values(array: np.ndarray) -> dict[str, object]:
    """The array's values as a tensor, or an ``Unrecorded`` marker saying why not: raising here
    would fail the whole capture at the call's snapshot (it is the state codec's ``attributes``),
    where a value no tensor holds is one marker in the call data."""
    import numpy as np

    if array.dtype.kind not in _STORED_KINDS:
        return {"values": Unrecorded("numpy.ndarray", f"a numpy array of dtype {array.dtype} (only bool, integer, "
                                     "float and complex arrays are stored)")}
    native = np.asarray(array, dtype=array.dtype.newbyteorder("="), order="C")  # (ascontiguousarray makes 0-d 1-d)
    try:
        values = torch.from_numpy(native)
    except TypeError as error:  # a dtype torch has no counterpart of (longdouble)
        return {"values": Unrecorded("numpy.ndarray", f"a numpy array of dtype {array.dtype}: {error}")}
    return {"values": values}


def _array(cls: type, parts: Mapping[str, object]) -> object:
    values = parts["values"]
    if isinstance(values, Unrecorded):  # the whole array stands as the marker
        return values
    if not isinstance(values, torch.Tensor):
        raise UnsupportedValueError(f"a numpy array's values are a {type(values).__name__}, not a tensor")
    return values.detach().cpu().resolve_conj().resolve_neg().numpy()  # (a load may have moved it to a device)


def _scalar_values(scalar: np.generic) -> dict[str, object]:
    import numpy as np

    return _values(np.asarray(scalar))


def _scalar(cls: type, parts: Mapping[str, object]) -> object:
    import numpy as np

    if not issubclass(cls, (np.bool_, np.number)):  # what _scalar_values stores: a capture names no other class
        raise UntrustedCodeError(f"{cls.__module__}.{cls.__qualname__} is not a numeric numpy scalar type; refused by "
                                 "that codec")
    array = _array(cls, parts)
    return array if isinstance(array, Unrecorded) else cls(array[()])  # type: ignore[index]  # 0-d: its element


def install() -> None:
    import numpy as np

    register_state_codec(np.ndarray, name=ARRAY_CODEC, subclasses=False, attributes=_values, rebuild=_array)
    register_state_codec(np.generic, name=SCALAR_CODEC, attributes=_scalar_values, rebuild=_scalar)

"""Typed JSON encoding of Python values: constructor arguments and non-tensor call data.

Plain JSON values (``None``, ``bool``, ``int``, finite ``float``, ``str``) and lists are written
as themselves. Everything else is an object with a ``"$type"`` tag, so a user's dict can never be
confused with an encoded value (dicts are always tagged). Tensors are references into the
capture's tensor table; nested modules are references to their own recorded construction.

Types beyond the built-in ones go through the codec registry (:func:`register_codec`). Nothing here
unpickles: decoding only ever resolves a class or function by its recorded import path, under the
rules of :mod:`modulelens.format.imports`, and calls nothing but a class of the kind its tag
allows (a namedtuple, a dataclass, a codec's own type), checked before the call.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import enum
import functools
import importlib
import math
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from modulelens.errors import UnsupportedValueError, UntrustedCodeError
from modulelens.format import layouts
from modulelens.format.imports import Kind, resolve_import
from modulelens.format.layouts import is_plain
from modulelens.format.spec import UnrecordedEntry

JSON = Any
_Value = TypeVar("_Value")

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


# --------------------------------------------------------------------------------------------
# Import paths
# --------------------------------------------------------------------------------------------


def import_path(obj: object) -> str:
    """``"package.module:Qual.Name"`` for a class or function that can be imported back.

    ``__main__`` paths are accepted: the capture stores the source of the user's own modules and
    the loader rebuilds such classes from it (see :mod:`modulelens.restore.source`)."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise UnsupportedValueError(f"{obj!r} cannot be referenced by import path")
    # Builtins such as torch.relu report a private qualname (_VariableFunctionsClass.relu) but are
    # importable under their plain name: try both, and accept only a path that gives back `obj`.
    candidates = [f"{module}:{qualname}"]
    name = getattr(obj, "__name__", None)
    if name and name != qualname:
        candidates.append(f"{module}:{name}")
    if name and any(part.startswith("_") for part in module.split(".")):
        # A class of a private module that its package exports (torch._C:Generator is torch:Generator):
        # the public path, which a capture's reader may resolve (docs/security.md denies torch._C).
        candidates.insert(0, f"{module.partition('.')[0]}:{name}")
        if module.startswith("_") and "." not in module:  # a C accelerator's public module (_operator: operator)
            candidates.insert(0, f"{module[1:]}:{name}")
    for path in candidates:
        try:
            if import_object(path) is obj:
                return path
        except Exception:
            continue
    raise UnsupportedValueError(f"{obj!r} is not importable as {candidates[0]}")


def import_object(path: str) -> Any:
    """Resolve ``"package.module:Qual.Name"`` with no checks: only for paths modulelens itself
    names (checking that an object being encoded imports back, codec installers). Paths read from
    a capture go through :func:`modulelens.format.imports.resolve_import` instead."""
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------------------------
# Codec registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Codec:
    name: str
    # builtins.type below: in this class body `type` is the field
    type: builtins.type
    encode: Callable[[Any], Any]
    decode: Callable[[builtins.type, Any], Any]
    subclasses: bool
    state: bool = False  # a mutable container stored attribute by attribute (see register_state_codec)
    stored_class: Callable[[Any], builtins.type] | None = None  # the class recorded for a value (default: its own)
    accepts: Callable[[builtins.type], bool] | None = None  # a family of classes without a common base (else: type)


_CODECS: dict[str, Codec] = {}
_STATE_CODECS: dict[type, Codec | None] = {}  # memo of the state codec per exact type; reset on registration


def register_codec(
    type_: type,
    encode: Callable[[Any], Any],
    decode: Callable[[type, Any], Any],
    *,
    name: str | None = None,
    subclasses: bool = True,
) -> None:
    """Teach modulelens to store values of ``type_`` (constructor arguments, call inputs).

    ``encode(value)`` returns plain data (which may itself hold tensors, lists, dicts or other
    encodable values); ``decode(cls, data)`` rebuilds the value from that data, where ``cls`` is the
    value's exact class, imported from its recorded path. With ``subclasses=True`` the codec also
    serves subclasses of ``type_``.

    Example::

        import modulelens

        class Scale:
            def __init__(self, factor): self.factor = factor

        modulelens.register_codec(Scale, lambda s: {"factor": s.factor}, lambda cls, d: cls(**d))
    """
    codec_name = name or f"{type_.__module__}.{type_.__qualname__}"
    _CODECS[codec_name] = Codec(codec_name, type_, encode, decode, subclasses)
    _STATE_CODECS.clear()


class _Family:
    """The ``type`` of a family codec: no value is of it, so only ``accepts`` selects the codec."""


def register_family_codec(name: str, accepts: Callable[[type], bool], encode: Callable[[Any], Any],
                          decode: Callable[[type, Any], Any]) -> None:
    """A codec for the classes ``accepts(cls)`` is true for, when they share no base class of their
    own (diffusers' attention processors are plain classes). Decoding refuses any other class."""
    _CODECS[name] = Codec(name, _Family, encode, decode, subclasses=False, accepts=accepts)
    _STATE_CODECS.clear()


def register_state_codec(
    type_: type,
    *,
    name: str | None = None,
    subclasses: bool = True,
    attributes: Callable[[Any], dict[str, Any]] | None = None,
    rebuild: Callable[[type, dict[str, Any]], Any] | None = None,
    stored_class: Callable[[Any], type] | None = None,
) -> None:
    """Store instances of ``type_`` as their attributes, for mutable containers of tensors (caches).

    A value is recorded as its ``vars()`` (each attribute through the typed value encoding, so
    tensors, nested containers and classes work and anything else fails naming the attribute) and
    rebuilt without running ``__init__``: ``cls.__new__(cls)`` and the decoded attributes, for the
    recorded class only if it is ``type_`` (or, with ``subclasses``, a subclass). Because a module
    may change such a value in place, the tracer snapshots it attribute by attribute on entry,
    records it again after the call (``mutated_inputs``) and replay compares both (docs/fidelity.md).

    Args:
        type_: the type (and, with ``subclasses``, its subclasses).
        name: the codec's name in captures (default ``"module.QualName"`` of ``type_``).
        subclasses: serve subclasses of ``type_`` too.
        attributes: ``value -> {name: part}``, the parts a value is stored, copied and compared as,
            instead of ``vars(value)``.
        rebuild: ``(cls, parts) -> value``, a new value of class ``cls`` from its parts, instead of
            ``cls.__new__(cls)`` with the parts as attributes. Snapshots and replay copies call it
            with the value's own class, loading with the recorded one.
        stored_class: ``value -> class`` recorded for a value, when its own class cannot be imported
            elsewhere (one generated at run time); ``rebuild`` then receives that class.

    Example::

        import modulelens

        class RunningStats:
            def __init__(self): self.total, self.count = torch.zeros(4), 0

        modulelens.register_state_codec(RunningStats)
    """
    codec_name = name or f"{type_.__module__}.{type_.__qualname__}"
    _CODECS[codec_name] = Codec(codec_name, type_, attributes or attributes_of, rebuild or rebuilt_from_attributes, subclasses,
                                state=True, stored_class=stored_class)
    _STATE_CODECS.clear()


def attributes_of(value: object) -> dict[str, object]:
    """A plain object's attributes (``vars()``): what a codec by attributes stores."""
    return dict(vars(value))


def rebuilt_from_attributes(cls: type, attributes: Mapping[str, object]) -> object:
    """A ``cls`` made without ``__init__``, its attributes set back: what a codec by attributes decodes."""
    value = cls.__new__(cls)  # type: ignore[call-overload]  # mypy takes a class's __new__ for type.__new__
    value.__dict__.update(attributes)
    return value


def is_state_object(value: object) -> bool:
    """Whether ``value`` is stored by a state codec (:func:`register_state_codec`): a container
    that the call-data walkers (snapshot, copy, compare) look inside, attribute by attribute."""
    codec = _STATE_CODECS.get(type(value), _UNKNOWN)  # on every recorded call's leaves: the memo inline
    return (codec if codec is not _UNKNOWN else _state_codec(value)) is not None


_UNKNOWN: Any = object()


def _state_codec(value: object) -> Codec | None:
    cls = type(value)
    try:
        return _STATE_CODECS[cls]
    except KeyError:
        pass
    codec = None
    if not (isinstance(value, (torch.Tensor, str, bytes, int, float, type)) or value is None):
        found = _find_codec(value)
        codec = found if found is not None and found.state else None
    _STATE_CODECS[cls] = codec
    return codec


def state_attributes(value: object) -> dict[str, object]:
    """The parts a state object is stored as (see :func:`register_state_codec`)."""
    codec = _state_codec(value)
    assert codec is not None, f"{type(value)} has no state codec"
    return dict(codec.encode(value))


def with_state_attributes(value: _Value, attributes: Mapping[str, object]) -> _Value:
    """A new instance of ``value``'s class holding ``attributes`` (``__init__`` is not run, unless
    the codec's own ``rebuild`` does)."""
    codec = _state_codec(value)
    assert codec is not None, f"{type(value)} has no state codec"
    return codec.decode(type(value), attributes)


# Codecs for optional libraries, installed the first time they can matter: at encode time once
# the library is imported by the job (``module in sys.modules``), at decode time when a capture
# names the codec. No optional library is ever imported just to encode a value.
_LAZY_CODECS: dict[str, tuple[str, str]] = {}  # codec name -> (library module, "pkg.mod:installer")


def register_lazy_codec(name: str, library: str, installer: str) -> None:
    """Declare codec ``name`` for values of ``library``; ``installer`` (an import path to a
    no-argument function) calls :func:`register_codec` when ``library`` is in use."""
    _LAZY_CODECS[name] = (library, installer)


def _install_lazy(name: str) -> None:
    _library, installer = _LAZY_CODECS[name]
    for other in [n for n, (_, i) in _LAZY_CODECS.items() if i == installer]:  # one installer, many codecs
        del _LAZY_CODECS[other]
    import_object(installer)()


def _install_loaded_lazy_codecs() -> None:
    for name, (library, _installer) in list(_LAZY_CODECS.items()):
        if library in sys.modules and name in _LAZY_CODECS:  # an earlier installer may have covered it
            _install_lazy(name)


def _codec_named(name: str) -> Codec | None:
    lazy = name.partition(":")[0]  # "library.Family:Member" codecs come with their family's installer
    if name not in _CODECS and lazy in _LAZY_CODECS:
        _install_lazy(lazy)
    if name not in _CODECS:
        _import_codec_modules()
    return _CODECS.get(name)


#: comma-separated modules a process imports before it decodes a codec nothing registered yet
CODEC_MODULES_ENV = "MODULELENS_CODECS"
#: the entry-point group through which an installed package names its module of codecs
CODEC_ENTRY_POINTS = "modulelens.codecs"
_codec_modules: list[str] | None = None  # what _import_codec_modules imported (None: not yet); failures by name


def _import_codec_modules() -> None:
    """Import the modules that register the user's codecs, once per process, the first time a
    capture names a codec nothing registered: a codec registered in the user's own module (not in
    the module of the class it serves) was found by their script, which imports it, but never by
    ``modulelens replay``, the MCP server or the UI. The modules are named by the user, in
    ``$MODULELENS_CODECS``, or by an installed package's entry point (group ``modulelens.codecs``):
    never by a capture."""
    global _codec_modules
    if _codec_modules is not None:
        return
    _codec_modules = []
    import os
    from importlib.metadata import entry_points

    names = [n.strip() for n in os.environ.get(CODEC_MODULES_ENV, "").split(",") if n.strip()]
    found: list[tuple[str, str, Callable[[], object]]] = [
        (f"${CODEC_MODULES_ENV}", name, functools.partial(importlib.import_module, name)) for name in names]
    found += [(f"entry point {point.name!r}", point.value, point.load)
              for point in entry_points(group=CODEC_ENTRY_POINTS)]
    for source, name, load in found:
        try:
            load()
        except Exception as error:  # said with the missing codec's error (_decode_codec)
            _codec_modules.append(f"{name} ({source}) failed to import: {type(error).__name__}: {error}")
        else:
            _codec_modules.append(f"{name} ({source})")


def has_codec(value: object) -> bool:
    """Whether a registered codec encodes ``value``."""
    return _find_codec(value) is not None


def _find_codec(value: object) -> Codec | None:
    if _LAZY_CODECS:
        _install_loaded_lazy_codecs()
    cls = type(value)
    for codec in reversed(list(_CODECS.values())):  # the most recently registered wins
        if cls is codec.type:
            return codec
    for codec in reversed(list(_CODECS.values())):
        if codec.accepts is not None:
            if codec.accepts(cls):
                return codec
        elif codec.subclasses and isinstance(value, codec.type):
            return codec
    return None


# --------------------------------------------------------------------------------------------
# Encoding context
# --------------------------------------------------------------------------------------------


@dataclass
class EncodeContext:
    """What an encoding pass needs besides the value.

    ``add_tensor`` puts a tensor into the capture's tensor table and returns its id;
    ``add_module`` does the same for an ``nn.Module`` constructor argument (``None`` when modules
    are not allowed here). With ``lenient=True`` (call data), a value with no encoding becomes an
    explicit "unrecorded" marker instead of an error, and its path is listed in ``unrecorded``.
    """

    add_tensor: Callable[[torch.Tensor, str], str]
    add_module: Callable[[torch.nn.Module, str], str] | None = None
    lenient: bool = False
    unrecorded: list[UnrecordedEntry] = field(default_factory=list)
    # id(value) -> (value, its encoding), for objects a codec or the dataclass encoding stores, with
    # ``memo={}``: constructor arguments of one capture, where every submodule of a transformers
    # model holds the same config (15 encodings of it per capture of a 59-module Llama before).
    # Their encodings are then one shared JSON object: never change them in place.
    memo: dict[int, tuple[Any, JSON]] | None = None


@dataclass
class DecodeContext:
    """What decoding needs besides the data. ``resolve(path, kind)`` turns a recorded import path
    into an object of that kind (:func:`modulelens.format.imports.resolve_import`: the capture's
    trust rules; the loader swaps in one that can fall back to trusted stored source)."""

    get_tensor: Callable[[str], torch.Tensor]
    get_module: Callable[[str], torch.nn.Module] | None = None
    resolve: Callable[[str, Kind], Any] = resolve_import


_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType)


def encode_value(value: object, ctx: EncodeContext, path: str) -> JSON:
    """Encode ``value``; ``path`` names it in errors (``"kwargs['activation']"``)."""
    if isinstance(value, Unrecorded):  # the tracer could not copy it: say so, as for a value with no encoding
        if not ctx.lenient:
            raise UnsupportedValueError(f"{path}: not recorded: {value.reason}")
        ctx.unrecorded.append({"path": path, "type": value.type_name, "reason": value.reason})
        return {"$type": "unrecorded", "class": value.type_name, "reason": value.reason}
    try:
        return _encode(value, ctx, path)
    except UnsupportedValueError as error:
        if not ctx.lenient:
            raise
        ctx.unrecorded.append({"path": path, "type": _type_label(value), "reason": str(error)})
        return {"$type": "unrecorded", "class": _type_label(value), "reason": str(error)}


def _type_label(value: object) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _encode(value: object, ctx: EncodeContext, path: str) -> JSON:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int:
        return value
    if type(value) is float:
        if math.isfinite(value):
            return value
        return {"$type": "float", "value": repr(value)}
    if isinstance(value, torch.Tensor):
        if is_plain(value):
            return {"$type": "tensor", "id": ctx.add_tensor(value, path)}
        try:  # sparse and nested tensors: their strided parts (format/layouts.py)
            return layouts.encode(value, lambda part, where: _encode(part, ctx, where), path)
        except ValueError as error:
            raise UnsupportedValueError(f"{path}: {error}") from None
    if isinstance(value, torch.nn.Module):
        if ctx.add_module is None:
            raise UnsupportedValueError(f"{path}: an nn.Module cannot be stored here")
        return {"$type": "module", "ref": ctx.add_module(value, path)}
    if isinstance(value, torch.dtype):
        return {"$type": "dtype", "value": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$type": "device", "value": str(value)}
    if isinstance(value, torch.Size):
        return {"$type": "size", "value": list(value)}
    if type(value) is list:
        return [encode_value(v, ctx, f"{path}[{i}]") for i, v in enumerate(value)]
    if type(value) is tuple:
        return {"$type": "tuple", "items": [encode_value(v, ctx, f"{path}[{i}]") for i, v in enumerate(value)]}
    if type(value) is dict:
        return {"$type": "dict", "items": [
            [encode_value(k, ctx, f"{path}.key"), encode_value(v, ctx, f"{path}[{k!r}]")] for k, v in value.items()
        ]}
    if type(value) is set or type(value) is frozenset:
        items = sorted(value, key=repr)
        return {"$type": type(value).__name__, "items": [encode_value(v, ctx, f"{path}[{i}]") for i, v in enumerate(items)]}
    if type(value) is complex:
        return {"$type": "complex", "real": value.real, "imag": value.imag}
    if type(value) is bytes:
        return {"$type": "bytes", "hex": value.hex()}
    if type(value) is slice:
        return {"$type": "slice", "items": [encode_value(v, ctx, path) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"$type": "ellipsis"}
    if isinstance(value, type) or isinstance(value, _FUNCTION_TYPES):
        try:
            return {"$type": "import", "path": import_path(value)}
        except UnsupportedValueError as error:
            raise UnsupportedValueError(f"{path}: {error}") from None
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple (a class attribute)
        return {"$type": "namedtuple", "class": _class_path(value, path),
                "items": [encode_value(v, ctx, f"{path}.{n}") for n, v in zip(value._fields, value, strict=False)]}
    memo = ctx.memo
    if memo is not None:
        hit = memo.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
    codec = _find_codec(value)
    if codec is None and dataclasses.is_dataclass(value):
        encoded = {"$type": "dataclass", "class": _class_path(value, path),
                   "fields": encode_value(_encode_dataclass(value), ctx, path)}
    elif codec is not None:
        cls_path = _class_path(value, path) if codec.stored_class is None else _stored_path(codec, value, path)
        data = codec.encode(value)
        encoded = {"$type": "codec", "codec": codec.name, "class": cls_path, "value": encode_value(data, ctx, path)}
    else:
        encoded = None
    if encoded is not None:
        if memo is not None and not codec_is_state(codec):
            memo[id(value)] = (value, encoded)
        return encoded
    raise UnsupportedValueError(
        f"{path}: cannot store a value of type {_type_label(value)} "
        f"(register one with modulelens.register_codec)"
    )


def codec_is_state(codec: Codec | None) -> bool:
    return codec is not None and codec.state


def _stored_path(codec: Codec, value: object, path: str) -> str:
    assert codec.stored_class is not None
    try:
        return import_path(codec.stored_class(value))
    except UnsupportedValueError as error:
        raise UnsupportedValueError(f"{path}: {error}") from None


def _class_path(value: object, path: str) -> str:
    try:
        return import_path(type(value))
    except UnsupportedValueError as error:
        raise UnsupportedValueError(f"{path}: {error}") from None


def decode_value(data: JSON, ctx: DecodeContext) -> Any:
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode_value(v, ctx) for v in data]
    tag = data.get("$type")
    if tag == "tensor":
        return ctx.get_tensor(data["id"])
    if tag == "module":
        if ctx.get_module is None:
            raise UnsupportedValueError("a module reference appears where none is allowed")
        return ctx.get_module(data["ref"])
    if tag == "float":
        return float(data["value"])
    if tag == "dtype":
        dtype = getattr(torch, data["value"], None)
        if not isinstance(dtype, torch.dtype):
            raise UnsupportedValueError(f"dtype {data['value']!r} does not exist in this torch {torch.__version__}")
        return dtype
    if tag == "device":
        return torch.device(data["value"])
    if tag == "size":
        return torch.Size(data["value"])
    if tag == "tuple":
        return tuple(decode_value(v, ctx) for v in data["items"])
    if tag == "dict":
        return {decode_value(k, ctx): decode_value(v, ctx) for k, v in data["items"]}
    if tag in ("set", "frozenset"):
        items = [decode_value(v, ctx) for v in data["items"]]
        return set(items) if tag == "set" else frozenset(items)
    if tag == "complex":
        return complex(data["real"], data["imag"])
    if tag == "bytes":
        return bytes.fromhex(data["hex"])
    if tag == "slice":
        return slice(*(decode_value(v, ctx) for v in data["items"]))
    if tag == "ellipsis":
        return Ellipsis
    if tag == "import":
        return ctx.resolve(data["path"], "value")
    if tag == "namedtuple":
        cls = ctx.resolve(data["class"], "class")
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise UntrustedCodeError(f"{data['class']} is not a namedtuple class; refused")
        return cls(*(decode_value(v, ctx) for v in data["items"]))
    if tag == "dataclass":
        cls = ctx.resolve(data["class"], "class")
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise UntrustedCodeError(f"{data['class']} is not a dataclass; refused")
        return _decode_dataclass(cls, decode_value(data["fields"], ctx))
    if tag in ("sparse", "nested"):
        return layouts.decode(data, lambda part: decode_value(part, ctx))
    if tag == "unrecorded":
        return Unrecorded(data["class"], data.get("reason", ""))
    if tag == "codec":
        return _decode_codec(data, ctx)
    raise UnsupportedValueError(f"unknown value tag {tag!r} in capture metadata")


def _decode_codec(data: dict[str, Any], ctx: DecodeContext) -> object:
    """A registered codec's value: its class must be the codec's own type (or, for a codec that
    serves subclasses, a subclass), checked before the codec's decoder calls it."""
    codec = _codec_named(data["codec"])
    if codec is None:
        imported = f"; imported for codecs: {', '.join(_codec_modules)}" if _codec_modules else ""
        raise UnsupportedValueError(
            f"no codec {data['codec']!r} is registered (import the module that registers it; for the command line, "
            f"name it in ${CODEC_MODULES_ENV}=module[,module...] or in an entry point of group "
            f"{CODEC_ENTRY_POINTS!r}{imported})"
        )
    cls = ctx.resolve(data["class"], "class")
    accepted = codec.accepts(cls) if codec.accepts is not None else (
        cls is codec.type or (codec.subclasses and issubclass(cls, codec.type)))
    if not accepted:
        raise UntrustedCodeError(f"{data['class']} is not a {codec.name} type; refused by that codec")
    value = decode_value(data["value"], ctx)
    if codec.type is functools.partial and not (isinstance(value, dict) and _allowed_partial_target(value.get("func"))):
        raise UntrustedCodeError("a functools.partial in the capture wraps something that is not an allowed "
                                 "class or function; refused")
    return codec.decode(cls, value)


def _allowed_partial_target(func: object) -> bool:
    """``partial`` may only wrap what an ``"import"`` value may be (a class or function that
    passed the import rules) or another such partial."""
    return isinstance(func, (type, types.FunctionType, types.BuiltinFunctionType, functools.partial))


@dataclass(frozen=True)
class Unrecorded:
    """Stands in for a call value that could not be stored (e.g. a cache object)."""

    __modulelens_marker__: ClassVar[bool] = True
    type_name: str
    reason: str = ""

    def __repr__(self) -> str:
        return f"<unrecorded {self.type_name}>"


# --------------------------------------------------------------------------------------------
# Built-in codecs for common constructor arguments
# --------------------------------------------------------------------------------------------


def _encode_dataclass(value: DataclassInstance | type[DataclassInstance]) -> dict[str, object]:
    """Every field (``init=False`` ones too, set after construction), so a dataclass round-trips."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if hasattr(value, f.name)}


def _decode_dataclass(cls: type, fields: Mapping[str, object]) -> object:
    init_names = {f.name for f in dataclasses.fields(cls) if f.init}
    value = cls(**{k: v for k, v in fields.items() if k in init_names})
    for name, field_value in fields.items():
        if name not in init_names:
            object.__setattr__(value, name, field_value)  # frozen dataclasses too
    return value


def _generator(cls: type, parts: dict[str, Any]) -> torch.Generator:
    generator = torch.Generator(device=parts["device"])
    generator.set_state(parts["state"])
    return generator


register_codec(enum.Enum, lambda e: e.value, lambda cls, v: cls(v), name="enum")
# A random generator passed to a module (diffusers' VAE samples its posterior with one): its device and
# state, recorded before and after the call, so replay draws the same numbers and checks it drew as many.
register_state_codec(torch.Generator, name="torch.Generator", subclasses=False, rebuild=_generator,
                     attributes=lambda g: {"device": g.device, "state": g.get_state()})
# nn.Sequential(OrderedDict(...)) (timm's hybrid ViT backbones) takes only an OrderedDict for named
# children: a plain dict would rebuild another structure. Exact type only (ModelOutput subclasses it).
register_codec(collections.OrderedDict, lambda d: [[k, v] for k, v in d.items()],
               lambda cls, items: cls((k, v) for k, v in items), name="OrderedDict", subclasses=False)
register_codec(
    functools.partial,
    lambda p: {"func": p.func, "args": tuple(p.args), "keywords": dict(p.keywords)},
    lambda cls, d: cls(d["func"], *d["args"], **d["keywords"]),
    name="partial",
)


# Optional libraries (see docs/codecs.md): ``transformers`` configuration objects and caches,
# torch_geometric's graphs and batches, diffusers' attention processors and latent distributions,
# gpytorch's multivariate normals.
for _name in ("transformers.PretrainedConfig", "transformers.Cache", "transformers.BatchEncoding"):
    register_lazy_codec(_name, "transformers", "modulelens.format.transformers_codecs:install")
for _name in ("torch_geometric.Data", "torch_geometric.Batch"):
    register_lazy_codec(_name, "torch_geometric", "modulelens.format.pyg_codecs:install")
for _name in ("diffusers.AttentionProcessor", "diffusers.DiagonalGaussianDistribution"):
    register_lazy_codec(_name, "diffusers", "modulelens.format.diffusers_codecs:install")
register_lazy_codec("gpytorch.MultivariateNormal", "gpytorch", "modulelens.format.gpytorch_codecs:install")
# numpy arrays and scalars (reinforcement-learning policies' observations and actions)
for _name in ("numpy.ndarray", "numpy.generic"):
    register_lazy_codec(_name, "numpy", "modulelens.format.numpy_codecs:install")
# torch's own tools: quantization configs and qschemes (QAT/PTQ-prepared modules), accelerate's
# model hooks, fx graphs (symbolic_trace, torch.export's .module()) and the constants they hold
for _name in ("torch.ao.quantization._PartialWrapper", "torch.qscheme"):
    register_lazy_codec(_name, "torch.ao.quantization", "modulelens.format.torch_codecs:install")
register_lazy_codec("accelerate.ModelHook", "accelerate", "modulelens.format.accelerate_codecs:install")
# plain objects libraries pass to their modules' constructors (the census found them)
register_lazy_codec("sentence_transformers.WordTokenizer", "sentence_transformers",
                    "modulelens.format.library_object_codecs:install_sentence_transformers")
register_lazy_codec("kornia.ColorMap", "kornia", "modulelens.format.library_object_codecs:install_kornia")
register_lazy_codec("tensordict.TensorDict", "tensordict", "modulelens.format.library_object_codecs:install_tensordict")
# reinforcement learning: gymnasium's spaces and stable-baselines3's schedules (a policy's constructor arguments)
for _name in ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple"):
    register_lazy_codec(f"gymnasium.{_name}", "gymnasium", "modulelens.format.library_object_codecs:install_gymnasium")
for _name in ("ConstantSchedule", "FloatSchedule", "LinearSchedule"):
    register_lazy_codec(f"stable_baselines3.{_name}", "stable_baselines3",
                        "modulelens.format.library_object_codecs:install_stable_baselines3")
for _name in ("torch.fx.Graph", "torch.memory_format", "torch.layout"):
    register_lazy_codec(_name, "torch.fx", "modulelens.format.fx_codecs:install")

"""Call inputs and outputs as pytrees: structure as typed JSON, leaves as encoded values.

torch's own pytree flattens the structure (so types registered with it, such as transformers'
``ModelOutput`` or torchrec's ``KeyedJaggedTensor``, work unchanged). The tree spec is written
node by node: the node type by import path and its context through the typed value encoding, which
handles what ``treespec_dumps`` cannot (namedtuples, non-string dict keys).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, TypeVar

import torch
import torch.utils._pytree as pytree

from modulelens.errors import CorruptCaptureError, UnsupportedValueError, UntrustedCodeError
from modulelens.format import layouts
from modulelens.format.layouts import is_plain, layout_name
from modulelens.format.spec import EncodedTree, TensorEntry
from modulelens.format.values import (
    JSON,
    DecodeContext,
    EncodeContext,
    decode_value,
    encode_value,
    import_path,
    is_state_object,
    state_attributes,
    with_state_attributes,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_LEAF = "*"
_Tree = TypeVar("_Tree")


def flatten_with_paths(tree: object) -> tuple[list[tuple[str, object]], pytree.TreeSpec]:
    """``([(key string, leaf), ...], spec)``: :func:`torch.utils._pytree.tree_flatten_with_path`
    with its key strings, also for node types registered without a ``flatten_with_keys_fn``
    (diffusers' ``BaseOutput``, whose whole UNet capture was dropped, issue 22): their children are
    named by their context's keys when it lists one per child, else by position."""
    try:
        found, spec = pytree.tree_flatten_with_path(tree)
        return [(pytree.keystr(key_path), leaf) for key_path, leaf in found], spec
    except ValueError:  # a node type without keys
        leaves, spec = pytree.tree_flatten(tree)
        return list(zip(spec_paths(spec), leaves, strict=True)), spec


def spec_paths(spec: pytree.TreeSpec, prefix: str = "") -> list[str]:
    """The key strings of a spec's leaves, as :func:`flatten_with_paths` names them."""
    if spec.is_leaf():
        return [prefix]
    children = spec.children()
    try:
        flatten_with_keys = pytree.SUPPORTED_NODES[spec.type].flatten_with_keys_fn
        keys = flatten_with_keys is not None and [
            pytree.keystr((key,)) for key, _ in flatten_with_keys(
                pytree.tree_unflatten([0] * spec.num_leaves, spec))[0]]
    except Exception:  # a node that cannot be rebuilt from placeholders
        keys = None
    if not keys or len(keys) != len(children):
        context = spec.context
        named = isinstance(context, (list, tuple)) and len(context) == len(children) and all(
            isinstance(k, str) for k in context)
        keys = [f"[{k!r}]" for k in context] if named else [f"[{i}]" for i in range(len(children))]
    return [path for key, child in zip(keys, children, strict=True) for path in spec_paths(child, prefix + key)]


def encode_tree(tree: object, ctx: EncodeContext, path: str) -> EncodedTree:
    leaves_with_paths, spec = flatten_with_paths(tree)
    leaves: list[JSON] = []
    encoded_spec = _encode_node(spec, iter(leaves_with_paths), leaves, ctx, path)
    return {"spec": encoded_spec, "leaves": leaves}


def decode_tree(data: JSON, ctx: DecodeContext, spec: pytree.TreeSpec | None = None) -> Any:
    """The tree stored as ``data``; ``spec``: its structure decoded already (:func:`decode_spec`),
    for a caller that decodes the same tree many times."""
    leaves = [decode_value(leaf, ctx) for leaf in data["leaves"]]
    if spec is None:
        spec = _decode_spec(data["spec"], ctx)
    try:
        return pytree.tree_unflatten(leaves, spec)
    except (TypeError, ValueError, KeyError) as error:  # a context that does not fit its container type
        raise CorruptCaptureError(f"a stored call structure does not rebuild: {type(error).__name__}: {error}") from None


def decode_spec(data: JSON, ctx: DecodeContext) -> pytree.TreeSpec:
    """The structure of a stored tree (its node types resolved under ``ctx``'s import rules)."""
    return _decode_spec(data["spec"], ctx)


def _encode_node(spec: pytree.TreeSpec, leaves_in: Iterator[tuple[str, object]], leaves_out: list[JSON],
                 ctx: EncodeContext, path: str) -> JSON:
    if spec.is_leaf():
        key, leaf = next(leaves_in)
        leaves_out.append(encode_value(leaf, ctx, path + key))
        return _LEAF
    try:
        node = _encode_node_header(spec, path)
    except UnsupportedValueError as error:
        if not ctx.lenient:
            raise
        # A container that cannot be stored becomes one explicit "unrecorded" leaf.
        subtree = [next(leaves_in) for _ in range(spec.num_leaves)]
        first, inner = (subtree[0][0], spec_paths(spec)[0]) if subtree else ("", "")
        where = path + first[:len(first) - len(inner)]  # the first leaf's path, less its part inside the node
        label = _type_name(spec.context if isinstance(spec.context, type) else spec.type)  # a namedtuple's class
        ctx.unrecorded.append({"path": where, "type": label, "reason": str(error)})
        leaves_out.append({"$type": "unrecorded", "class": label, "reason": str(error)})
        return _LEAF
    node["children"] = [_encode_node(child, leaves_in, leaves_out, ctx, path) for child in spec.children()]
    return node


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _encode_node_header(spec: pytree.TreeSpec, path: str) -> dict[str, JSON]:
    node_type = spec.type
    try:
        type_path = import_path(node_type)
    except UnsupportedValueError as error:
        raise UnsupportedValueError(f"{path}: container type {node_type!r}: {error}") from None
    strict = EncodeContext(add_tensor=_no_tensors)
    try:
        context = {"value": encode_value(spec.context, strict, path)}
    except UnsupportedValueError as value_error:
        node = pytree.SUPPORTED_SERIALIZED_TYPES.get(node_type)
        if node is None or node.to_dumpable_context is None:
            raise UnsupportedValueError(
                f"{path}: cannot store the structure of {type_path} (its pytree context has no encoding)"
            ) from None
        try:
            context = {"dumpable": node.to_dumpable_context(spec.context)}
        except Exception:  # e.g. a namedtuple class that is not importable
            raise UnsupportedValueError(f"cannot store the structure of {type_path}: {value_error}") from None
    return {"type": type_path, "context": context}


def _decode_spec(data: JSON, ctx: DecodeContext | None = None) -> pytree.TreeSpec:
    ctx = ctx or DecodeContext(get_tensor=_no_tensor_ids)
    if data == _LEAF:
        return pytree.treespec_leaf()
    node_type = ctx.resolve(data["type"], "node")
    context_data = data["context"]
    if "dumpable" in context_data:
        node = pytree.SUPPORTED_SERIALIZED_TYPES.get(node_type)
        if node is None or node.from_dumpable_context is None:
            raise UnsupportedValueError(f"container type {data['type']} has no stored-context decoder")
        context = node.from_dumpable_context(context_data["dumpable"])
    else:
        context = decode_value(context_data["value"], DecodeContext(get_tensor=_no_tensor_ids, resolve=ctx.resolve))
        if node_type is collections.namedtuple and not (
                isinstance(context, type) and issubclass(context, tuple) and hasattr(context, "_fields")):
            # pytree rebuilds a namedtuple node by calling its context: it must be a namedtuple class
            raise UntrustedCodeError(f"a namedtuple node names {context!r}, which is not a namedtuple class; refused")
    children = [_decode_spec(child, ctx) for child in data["children"]]
    try:
        return pytree.TreeSpec(node_type, context, children)
    except (TypeError, ValueError) as error:
        raise CorruptCaptureError(f"a stored {data['type']} structure is damaged: {error}") from None


def input_path(key_text: str) -> str:
    """The readable name of an input leaf from its pytree key string.

    Inputs are stored as one ``(args, kwargs)`` tree, so pytree names the leaves ``[0][2]`` and
    ``[1]['mask']``; people and reports say ``args[2]`` and ``kwargs['mask']``.

    Example::

        >>> input_path("[0][2]"), input_path("[1]['mask']")
        ('args[2]', "kwargs['mask']")
    """
    if key_text.startswith("[0]"):
        return "args" + key_text[3:]
    if key_text.startswith("[1]"):
        return "kwargs" + key_text[3:]
    return "inputs" + key_text


def leaf_paths(data: JSON, prefix: str) -> list[str]:
    """Readable paths of the leaves of an encoded tree, without decoding any value.

    Args:
        data: an encoded tree (``{"spec": ..., "leaves": [...]}``) as stored in capture metadata.
        prefix: ``"inputs"`` (paths become ``args[0]``, ``kwargs['x']``) or a root name such as
            ``"output"`` (paths become ``output[1]``).

    Returns:
        One path per leaf, in leaf order. When the structure names a type that cannot be imported
        here, the paths fall back to positions (``output[3]``) so a summary still renders.
    """
    count = len(data["leaves"])
    try:
        spec = _decode_spec(data["spec"])
        keys = spec_paths(spec)
    except (ImportError, AttributeError, KeyError, UnsupportedValueError):  # a container type not importable here
        return [f"{prefix}[{i}]" for i in range(count)]
    if len(keys) != count:
        return [f"{prefix}[{i}]" for i in range(count)]
    return [input_path(k) for k in keys] if prefix == "inputs" else [prefix + k for k in keys]


def tree_summary(data: EncodedTree | None, tensors: Mapping[str, TensorEntry], limit: int = 4) -> str:
    """``"float32[3, 8], <unrecorded Foo>, 2"``: the first ``limit`` leaves of an encoded tree, from
    metadata only (``tensors`` is the capture's tensor table; nothing is decoded)."""
    if data is None:
        return "-"
    parts = []
    for leaf in data["leaves"][:limit]:
        if isinstance(leaf, dict) and leaf.get("$type") == "tensor":
            entry = tensors[leaf["id"]]
            parts.append(f"{entry['dtype']}{entry['shape']}")
        elif isinstance(leaf, dict) and leaf.get("$type") == "unrecorded":
            parts.append(f"<unrecorded {leaf.get('class')}>")
        elif isinstance(leaf, dict) and leaf.get("$type") in ("sparse", "nested"):
            parts.append(f"<{leaf['$type']} {leaf.get('layout')}>")
        else:
            parts.append(repr(leaf)[:20])
    if len(data["leaves"]) > limit:
        parts.append("...")
    return ", ".join(parts) or "()"


def _no_tensors(_tensor: torch.Tensor, path: str) -> str:
    raise UnsupportedValueError(f"{path}: a tensor inside a pytree context")


def _no_tensor_ids(_id: str) -> torch.Tensor:
    raise UnsupportedValueError("a tensor reference inside a pytree context")


# --------------------------------------------------------------------------------------------
# Walking call data, dataclass and state-object leaves included
# --------------------------------------------------------------------------------------------
# torch's pytree treats an unregistered dataclass as a leaf; the value encoding stores it field by
# field. These helpers look inside such leaves too, so tensors in a dataclass input are copied,
# moved and compared like any other tensor (without registering user types with pytree globally).
# State objects (caches, see ``register_state_codec``) are walked the same way, attribute by
# attribute, and always come back as a new object: a module mutates them in place, so a snapshot
# or a replay copy must never share one with the job.


@dataclasses.dataclass(frozen=True)
class Flattened:
    """A tree flattened once, for walkers that each need its leaves, in torch's pytree order.

    The tracer looks at every recorded call's inputs three ways (DTensors to gather, the snapshot,
    the inputs a call may change in place) and at every output; one flatten serves them all. A tree
    of plain tuples, lists and dicts (nearly every call) is walked in Python, which is ~4x faster
    than pytree's generic walk (benchmarks/bench_recording.py); any other node (a namedtuple, a
    ``ModelOutput``, anything registered with pytree) sends the whole tree to pytree.
    """

    tree: Any  # the caller's own tree, handed back as it came
    leaves: list[object]
    _shape: _Shape | None  # a tree of plain containers: their types and keys, as they were
    _spec: pytree.TreeSpec | None  # any other tree

    @classmethod
    def of(cls, tree: object) -> Flattened:
        """``tree`` flattened (a tree flattened already comes back as it is)."""
        if isinstance(tree, Flattened):
            return tree
        leaves: list[object] = []
        shape = _plain_shape(tree, leaves)
        if shape is not _NOT_PLAIN:
            return cls(tree, leaves, shape, None)
        leaves, spec = pytree.tree_flatten(tree)
        return cls(tree, leaves, None, spec)

    def unflatten(self, leaves: list[object]) -> object:
        """The tree's structure (as it was when flattened) holding ``leaves``."""
        if self._spec is not None:
            return pytree.tree_unflatten(leaves, self._spec)
        return _rebuild(self._shape, iter(leaves))

    def paths(self, positions: tuple[int, ...]) -> list[str]:
        """The key paths (``pytree.keystr``) of the leaves at ``positions``."""
        if self._spec is None:
            found: list[str] = []
            _plain_paths(self._shape, "", found)
            return [found[i] for i in positions]
        try:
            return list(_leaf_paths(self._spec, positions))
        except TypeError:  # a node context that cannot be hashed: no memo
            return list(_leaf_paths.__wrapped__(self._spec, positions))


# The structure of a tree of plain containers: None for a leaf, else (type, dict keys or None, children).
_Shape = tuple[type, tuple[object, ...] | None, list["_Shape"]] | None


class _NotPlain(enum.Enum):
    """What :func:`_plain_shape` returns for a tree with a node other than a plain tuple, list or dict."""

    NOT_PLAIN = enum.auto()


_NOT_PLAIN = _NotPlain.NOT_PLAIN
# Leaves with nothing inside for a walker to look at (no fields, no children).
_ATOMS = frozenset({type(None), bool, int, float, str, torch.Tensor, torch.nn.Parameter, torch.device, torch.dtype})


def _plain_shape(node: Any, leaves: list[object]) -> _Shape | Literal[_NotPlain.NOT_PLAIN]:
    """Append ``node``'s leaves to ``leaves`` and return its shape, or ``_NOT_PLAIN`` when a node
    is neither a plain tuple, list or dict nor a pytree leaf."""
    cls = type(node)
    if cls in _ATOMS:
        leaves.append(node)
        return None
    if cls is tuple or cls is list or cls is dict:
        keys = tuple(node) if cls is dict else None
        children = []
        for child in (node.values() if cls is dict else node):
            shape = _plain_shape(child, leaves)
            if shape is _NOT_PLAIN:
                return _NOT_PLAIN
            children.append(shape)
        return (cls, keys, children)
    if pytree.tree_is_leaf(node):
        leaves.append(node)
        return None
    return _NOT_PLAIN


def _rebuild(shape: _Shape, leaves: Iterator[object]) -> object:
    if shape is None:
        return next(leaves)
    cls, keys, children = shape
    if keys is not None:  # a dict
        return {key: _rebuild(child, leaves) for key, child in zip(keys, children, strict=True)}
    return cls([_rebuild(child, leaves) for child in children])


def _plain_paths(shape: _Shape, prefix: str, found: list[str]) -> None:
    if shape is None:
        found.append(prefix)
        return
    _, keys, children = shape
    for i, child in enumerate(children):
        _plain_paths(child, f"{prefix}[{keys[i]!r}]" if keys is not None else f"{prefix}[{i}]", found)


def is_dataclass_leaf(value: object) -> TypeGuard[DataclassInstance]:
    """A dataclass instance torch's pytree sees as a leaf (modulelens' own markers excepted)."""
    return (type(value) not in _ATOMS and dataclasses.is_dataclass(value) and not isinstance(value, type)
            and type(value) not in pytree.SUPPORTED_NODES and not getattr(value, "__modulelens_marker__", False))


def has_fields(leaf: object) -> bool:
    """Whether the walkers (:func:`map_leaves`, :func:`deep_leaves`) look inside ``leaf``: a
    dataclass torch's pytree sees as a leaf, or a state object."""
    return is_dataclass_leaf(leaf) or is_state_object(leaf)


def _fields(leaf: object) -> dict[str, object] | None:
    """The named parts a walker looks inside (``None``: a plain leaf)."""
    if is_dataclass_leaf(leaf):
        return {f.name: getattr(leaf, f.name) for f in dataclasses.fields(leaf) if hasattr(leaf, f.name)}
    if is_state_object(leaf):
        return state_attributes(leaf)
    return None


def map_leaves(fn: Callable[[str, object], object], tree: object, path: str = "", *, state_objects: bool = True) -> object:
    """``tree`` with every leaf replaced by ``fn(path, leaf)``, descending into dataclass leaves
    and state objects (a state object is always rebuilt as a new object). With
    ``state_objects=False`` a state object is a leaf like any other (the job's own object kept).
    A walk that needs no paths is :func:`deep_flatten`'s (one walk, no key paths)."""

    def visit(where: str, leaf: object) -> object:
        fields = _fields(leaf) if state_objects or not is_state_object(leaf) else None
        if fields is None:
            return fn(where, leaf)
        mapped = {name: map_leaves(fn, old, f"{where}.{name}", state_objects=state_objects)
                  for name, old in fields.items()}
        return _with_fields(leaf, fields, mapped)

    if pytree.tree_is_leaf(tree):  # a single leaf (most attributes of a state object): no pytree walk
        return visit(path, tree)
    found, spec = flatten_with_paths(tree)
    return pytree.tree_unflatten([visit(path + key, leaf) for key, leaf in found], spec)


def _with_fields(leaf: _Tree, fields: Mapping[str, object], mapped: dict[str, object]) -> _Tree:
    """``leaf`` (a state object or a dataclass leaf) holding ``mapped`` instead of ``fields``: a
    state object always as a new object, a dataclass as a copy only if a field changed."""
    if is_state_object(leaf):
        return with_state_attributes(leaf, mapped)
    changed = {name: new for name, new in mapped.items() if new is not fields[name]}
    if not changed:
        return leaf
    result = copy.copy(leaf)
    for name, value in changed.items():
        object.__setattr__(result, name, value)
    return result


def deep_flatten(tree: object) -> tuple[list[object], Callable[[list[object]], object]]:
    """``(leaves, rebuild)``: the leaves :func:`map_leaves` would visit (dataclass fields and state
    attributes included, in the same order), and a function that builds the same tree holding
    other leaves, as ``map_leaves`` would (a state object always a new object).

    One walk and one rebuild, without key paths: the tracer snapshots every recorded call's inputs
    and output this way, and walking a transformers cache (~100 leaves) twice with ``map_leaves``
    (once to find the tensors that share a storage, once to copy them) was most of a GPT-2 block's
    recording cost (benchmarks/bench_recording.py).
    """
    leaves: list[object] = []
    build = _deep_builder(tree, leaves)

    def rebuild(new_leaves: list[object]) -> object:
        if len(new_leaves) != len(leaves):
            raise ValueError(f"deep_flatten: {len(new_leaves)} leaves for a tree of {len(leaves)}")
        return build(iter(new_leaves))
    return leaves, rebuild


_Builder = Callable[[Iterator[object]], object]


def _deep_builder(tree: object, leaves: list[object]) -> _Builder:
    """Append ``tree``'s deep leaves to ``leaves``; return what rebuilds it from an iterator of leaves."""
    if type(tree) in _ATOMS:  # most attributes of a state object: no flatten at all
        leaves.append(tree)
        return next
    flat = Flattened.of(tree)
    parts: list[_Builder] = []
    for leaf in flat.leaves:
        fields = _fields(leaf) if type(leaf) not in _ATOMS else None
        if fields is None:
            leaves.append(leaf)
            parts.append(next)
        else:
            builders = {name: _deep_builder(value, leaves) for name, value in fields.items()}
            parts.append(functools.partial(_build_fields, leaf, fields, builders))
    if not any(part is not next for part in parts):
        return lambda new: flat.unflatten([next(new) for _ in parts])
    return lambda new: flat.unflatten([part(new) for part in parts])


def _build_fields(leaf: object, fields: Mapping[str, object], builders: dict[str, _Builder], new: Iterator[object]) -> object:
    return _with_fields(leaf, fields, {name: build(new) for name, build in builders.items()})


def deep_leaves(tree: object, *, state_objects: bool = True) -> list[tuple[str, object]]:
    """``(path, leaf)`` for every leaf, dataclass fields and (unless ``state_objects=False``)
    state attributes included, in a stable order."""
    found: list[tuple[str, object]] = []

    def collect(where: str, leaf: object) -> object:
        found.append((where, leaf))
        return leaf

    map_leaves(collect, tree, state_objects=state_objects)
    return found


def mutable_leaves(tree: object) -> list[tuple[str, object]]:
    """``(path, value)`` for every tensor and every outermost state object of ``tree`` (dataclass
    fields included): what a call can change in place, at the paths :func:`deep_leaves` uses."""
    values, paths = mutable_values(tree)
    return list(zip(paths(), values, strict=True))


def mutable_values(tree: object) -> tuple[list[object], Callable[[], list[str]]]:
    """The values of :func:`mutable_leaves`, and a function that gives their paths.

    The tracer watches every recorded call's inputs but needs their paths only for the ones a call
    changed, and building pytree key paths costs three times the flatten itself (~100 us for a
    dict of four feature tuples, benchmarks/bench_recording.py), so they are built when asked.
    """
    flat = Flattened.of(tree)
    leaves = flat.leaves
    if any(is_dataclass_leaf(leaf) for leaf in leaves):  # rare: walk into the fields, with paths
        found = _mutable_with_paths(flat.tree)
        return [value for _, value in found], lambda: [path for path, _ in found]
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) or is_state_object(leaf))
    return [leaves[i] for i in positions], lambda: flat.paths(positions)


@functools.lru_cache(maxsize=256)
def _leaf_paths(spec: pytree.TreeSpec, positions: tuple[int, ...]) -> tuple[str, ...]:
    """The key paths of the leaves at ``positions`` of a tree shaped ``spec``, memoised: a call
    that takes a state object (a cache) asks on every recorded call, and the same structure comes
    back call after call (~60 us each, benchmarks/bench_recording.py)."""
    # the same structure with each leaf's position in it: its paths are the original's
    keys = spec_paths(spec)
    return tuple(keys[i] for i in positions)


def _mutable_with_paths(tree: object) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []

    def visit(where: str, leaf: object) -> None:
        if isinstance(leaf, torch.Tensor) or is_state_object(leaf):
            found.append((where, leaf))
        elif is_dataclass_leaf(leaf):
            for name, value in (_fields(leaf) or {}).items():
                for key, inner in flatten_with_paths(value)[0]:
                    visit(f"{where}.{name}{key}", inner)

    for key, leaf in flatten_with_paths(tree)[0]:
        visit(key, leaf)
    return found


def expand_dataclasses(tree: object) -> object:
    """``tree`` with dataclass leaves and state objects turned into dicts (class name included)
    for comparison, and sparse and nested tensors into their parts (a COO tensor coalesced first:
    one value per index, whatever order the kernel left them in)."""

    def expand(leaf: object) -> object:
        if isinstance(leaf, torch.Tensor) and not is_plain(leaf):
            found = layouts.parts(leaf.coalesce() if leaf.layout == torch.sparse_coo else leaf)
            del found["$type"], found["layout"]
            return {f"<{layout_name(leaf)}>": found.pop("size", None), **found}
        fields = _fields(leaf)
        if fields is None:
            return leaf
        marker = "<dataclass>" if is_dataclass_leaf(leaf) else "<object>"
        return {marker: type(leaf).__qualname__, **{name: expand_dataclasses(value) for name, value in fields.items()}}

    return pytree.tree_map(expand, tree)

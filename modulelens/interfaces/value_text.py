"""Recorded values as people read them: Python-like text from the typed JSON of docs/format.md.

A capture stores constructor arguments and call values as typed JSON (``{"$type": "tuple",
"items": [...]}``, ``{"$type": "codec", "codec": "transformers.PretrainedConfig", ...}``), which is
exact but unreadable. :func:`python_like` writes them the way they were written in Python:
``(1, 2)``, ``torch.float32``, ``LlamaConfig(hidden_size=64, ...)``, ``partial(gelu, approximate='tanh')``.
It decodes nothing and imports nothing (a capture from someone else stays inert): classes are
named, never loaded. ``show``, the notebook and the web UI use it for constructor arguments and
call values; :func:`spec_leaf_paths` names a stored tree's leaves the same way, from its JSON alone.

Long values are shortened, never silently: a container shows its first ``max_items`` entries and
``... +N more``, and ``limit`` cuts the text with ``…``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["argument_texts", "call_text", "construction_text", "dotted", "python_like", "short_class", "spec_leaf_paths",
           "spec_leaf_window"]

_MAX_ITEMS = 8
_MAX_SPEC_DEPTH = 64  # nesting of a stored tree structure (format/validate.py: MAX_DEPTH)
# What every transformers configuration has (``PretrainedConfig``'s own fields): written after the
# model's own fields (hidden_size, num_heads...), which are what a reader looks for first.
_GENERIC_CONFIG_KEYS = frozenset({
    "transformers_version", "architectures", "output_hidden_states", "output_attentions", "return_dict", "dtype",
    "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "id2label", "label2id",
    "problem_type", "_name_or_path", "model_type", "tokenizer_class", "prefix", "task_specific_params",
    "finetuning_task", "pruned_heads", "tie_word_embeddings", "add_cross_attention", "cross_attention_hidden_size",
    "tf_legacy_loss", "use_bfloat16", "torchscript", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "attn_implementation", "experts_implementation",
})


def python_like(
    value: object,
    metadata: Mapping[str, object] | None = None,
    *,
    constructions: Mapping[str, object] | None = None,
    tensors: Mapping[str, object] | None = None,
    max_items: int = _MAX_ITEMS,
    limit: int | None = None,
) -> str:
    """Python-like text for an encoded value (docs/format.md, "Encoded values").

    Args:
        value: the typed JSON of one value, as stored in a capture.
        metadata: the capture's metadata: its ``constructions`` and ``tensors`` (unless given).
        constructions: the capture's ``constructions`` (so a module argument shows as
            ``Linear(4, 8)``, not as a reference).
        tensors: the capture's ``tensors`` table (so a tensor shows its dtype and shape).
        max_items: entries shown per container before ``... +N more``.
        limit: cut the text to this many characters (``…`` at the end).

    Returns:
        One line of text.

    Example::

        >>> python_like({"$type": "tuple", "items": [1, {"$type": "dtype", "value": "float32"}]})
        '(1, torch.float32)'
    """
    meta = metadata or {}
    text = _Renderer(constructions or _mapping(meta.get("constructions")), tensors or _mapping(meta.get("tensors")),
                     max_items).render(value)
    if limit is not None and len(text) > limit:
        return text[: max(limit - 1, 0)] + "…"
    return text


def call_text(
    class_path: str,
    args: Sequence[object],
    kwargs: object,
    *,
    constructions: Mapping[str, object] | None = None,
    tensors: Mapping[str, object] | None = None,
    max_items: int = _MAX_ITEMS,
) -> str:
    """``Class(arg, key=value)`` for a construction record's class path, args and kwargs.

    Example::

        call_text("torch.nn.modules.linear:Linear", [4, 8], {"$type": "dict", "items": [["bias", False]]})
        # 'Linear(4, 8, bias=False)'
    """
    renderer = _Renderer(constructions or {}, tensors or {}, max_items)
    return renderer.call(class_path, args, kwargs)


def construction_text(construction: Mapping[str, object], metadata: Mapping[str, object] | None = None) -> str:
    """A recorded construction (``{"class", "args", "kwargs"}``) as a call: ``Linear(4, 8, bias=True)``."""
    meta = metadata or {}
    return call_text(str(construction.get("class", "?")), _sequence(construction.get("args")), construction.get("kwargs"),
                     constructions=_mapping(meta.get("constructions")), tensors=_mapping(meta.get("tensors")))


def argument_texts(construction: Mapping[str, object], metadata: Mapping[str, object] | None = None) -> dict[str, str]:
    """Each constructor argument as text, by label: ``args[0]``, ``args[1]``..., then keyword names.

    Example::

        argument_texts({"class": "m:Lin", "args": [4], "kwargs": {"bias": True}})  # {'args[0]': '4', 'bias': 'True'}
    """
    texts = {f"args[{i}]": python_like(v, metadata) for i, v in enumerate(_sequence(construction.get("args")))}
    kwargs = construction.get("kwargs") or {}
    if isinstance(kwargs, Mapping):
        pairs = _Renderer({}, {}, 1)._pairs(kwargs) if "$type" in kwargs else list(kwargs.items())
        texts.update({str(k): python_like(v, metadata) for k, v in pairs})
    return texts


def short_class(path: object) -> str:
    """``package.module:Outer.Name`` -> ``Outer.Name`` (the name as the user's code writes it)."""
    return (str(path).rpartition(":")[2] or str(path)) if isinstance(path, str) else repr(path)


def dotted(path: object) -> str:
    """``"torch.nn.modules.linear:Linear"`` -> ``"torch.nn.modules.linear.Linear"``."""
    return str(path).replace(":", ".") if isinstance(path, str) else repr(path)


def _is_identifier(key: object) -> bool:
    return isinstance(key, str) and key.isidentifier()


def _mapping(value: object) -> Mapping[str, object]:
    """``value`` if it is a JSON object, else an empty one (a part of the metadata that is missing)."""
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> Sequence[object]:
    """``value`` if it is a JSON array, else an empty one (arguments that were not recorded)."""
    return value if isinstance(value, (list, tuple)) else []


def _text(value: object) -> str:
    """A string field of an encoding (a damaged one raises, and is shown by its tag)."""
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _number(value: object) -> float:
    """A number field of an encoding (a damaged one raises, and is shown by its tag)."""
    if not isinstance(value, (int, float)):
        raise TypeError("not a number")
    return value


def _items(value: Mapping[str, object], key: str = "items") -> Sequence[object]:
    """An encoded container's ``items`` (a damaged encoding raises, and is shown by its tag)."""
    items = value[key]
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{key} is not a list")
    return items


class _Renderer:
    def __init__(self, constructions: Mapping[str, object], tensors: Mapping[str, object], max_items: int) -> None:
        self.constructions = constructions
        self.tensors = tensors
        self.max_items = max(1, max_items)
        self._depth = 0

    def render(self, value: object) -> str:
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        if isinstance(value, list):
            return "[" + self._join([self.render(v) for v in value]) + "]"
        if not isinstance(value, dict):
            return repr(value)
        tag = value.get("$type")
        handler = getattr(self, f"_{str(tag).replace('-', '_')}", None) if isinstance(tag, str) else None
        if handler is None or not str(tag).isidentifier():
            return self._codec_like(str(tag), value) if tag else "{...}"
        try:
            return handler(value)
        except (KeyError, TypeError, ValueError, AttributeError):
            return f"<{tag}>"  # damaged or unexpected encoding: name it, never fail a listing

    # ------------------------------------------------------------------ containers

    def _join(self, parts: list[str]) -> str:
        if len(parts) > self.max_items:
            parts = [*parts[: self.max_items], f"... +{len(parts) - self.max_items} more"]
        return ", ".join(parts)

    def _pairs(self, encoded_dict: object) -> list[tuple[object, object]]:
        """``[(key, value)]`` of an encoded dict (``{"$type": "dict", "items": [[k, v], ...]}``)."""
        if isinstance(encoded_dict, dict) and encoded_dict.get("$type") == "dict":
            return [(k, v) for k, v in encoded_dict.get("items", [])]
        return []

    def _tuple(self, value: Mapping[str, object]) -> str:
        items = [self.render(v) for v in _items(value)]
        return "(" + self._join(items) + ("," if len(items) == 1 else "") + ")"

    def _dict(self, value: Mapping[str, object]) -> str:
        return "{" + self._join([f"{self.render(k)}: {self.render(v)}" for k, v in self._pairs(value)]) + "}"

    def _set(self, value: Mapping[str, object]) -> str:
        return "{" + self._join([self.render(v) for v in _items(value)]) + "}" if _items(value) else "set()"

    def _frozenset(self, value: Mapping[str, object]) -> str:
        return "frozenset({" + self._join([self.render(v) for v in _items(value)]) + "})" if _items(value) else "frozenset()"

    # ------------------------------------------------------------------ scalars

    def _float(self, value: Mapping[str, object]) -> str:
        return f"float({value['value']!r})"

    def _complex(self, value: Mapping[str, object]) -> str:
        return repr(complex(_number(value["real"]), _number(value["imag"])))

    def _bytes(self, value: Mapping[str, object]) -> str:
        data = bytes.fromhex(_text(value["hex"]))
        return repr(data[:32]) + (f" (+{len(data) - 32} bytes)" if len(data) > 32 else "")

    def _slice(self, value: Mapping[str, object]) -> str:
        return "slice(" + ", ".join(self.render(v) for v in _items(value)) + ")"

    def _ellipsis(self, value: Mapping[str, object]) -> str:
        return "..."

    # ------------------------------------------------------------------ torch

    def _dtype(self, value: Mapping[str, object]) -> str:
        return f"torch.{value['value']}"

    def _device(self, value: Mapping[str, object]) -> str:
        return f"torch.device({value['value']!r})"

    def _size(self, value: Mapping[str, object]) -> str:
        return f"torch.Size({list(_items(value, 'value'))!r})"

    def _tensor(self, value: Mapping[str, object]) -> str:
        entry = self.tensors.get(_text(value["id"]))
        if not isinstance(entry, dict):
            return "tensor(...)"
        shape = ", ".join(str(s) for s in entry.get("shape", []))
        described = f"{entry.get('dtype', '?')}[{shape}]"
        if entry.get("shape_only"):
            return f"tensor({described}, shape-only)"
        return f"tensor({described})"

    def _module(self, value: Mapping[str, object]) -> str:
        record = self.constructions.get(_text(value["ref"]))
        if not isinstance(record, dict) or self._depth > 4:
            return f"<module {value['ref']}>"
        self._depth += 1
        try:
            return self.call(record.get("class", "?"), record.get("args", []), record.get("kwargs"))
        finally:
            self._depth -= 1

    # ------------------------------------------------------------------ classes and objects

    def _import(self, value: Mapping[str, object]) -> str:
        return short_class(value["path"])

    def _namedtuple(self, value: Mapping[str, object]) -> str:
        return f"{short_class(value['class'])}({self._join([self.render(v) for v in _items(value)])})"

    def _dataclass(self, value: Mapping[str, object]) -> str:
        return self._keywords(short_class(value["class"]), self._pairs(value["fields"]))

    def _unrecorded(self, value: Mapping[str, object]) -> str:
        return f"<unrecorded {value.get('class', '?')}>"

    def _codec(self, value: Mapping[str, object]) -> str:
        name = short_class(value["class"])
        data = value.get("value")
        if value.get("codec") == "partial":
            fields = dict(self._pairs(data))
            parts = [self.render(fields.get("func")), *(self.render(a) for a in _sequence(_mapping(fields.get("args")).get("items")))]
            parts += [f"{k}={self.render(v)}" for k, v in self._pairs(fields.get("keywords"))]
            return f"partial({self._join(parts)})"
        pairs = self._pairs(data)
        if value.get("codec") == "transformers.PretrainedConfig":  # {"config": to_dict(), runtime attributes}
            fields = dict(pairs)
            pairs = self._pairs(fields.pop("config", None)) + list(fields.items())
            pairs.sort(key=lambda pair: pair[0] in _GENERIC_CONFIG_KEYS)  # stable: the model's own fields first
        if pairs and all(_is_identifier(k) for k, _ in pairs):
            return self._keywords(name, pairs)
        return f"{name}({self.render(data)})"

    def _codec_like(self, tag: str, value: Mapping[str, object]) -> str:
        """A tag this renderer does not know (a newer format): its name and fields, still readable."""
        fields = [f"{k}={self.render(v)}" for k, v in value.items() if k != "$type" and _is_identifier(k)]
        return f"<{tag}{' ' if fields else ''}{self._join(fields)}>"

    def _keywords(self, name: str, pairs: list[tuple[object, object]]) -> str:
        return f"{name}({self._join([f'{k}={self.render(v)}' for k, v in pairs])})"

    def call(self, class_path: object, args: object, kwargs: object) -> str:
        parts = [self.render(a) for a in _sequence(args)]
        pairs = self._pairs(kwargs) if isinstance(kwargs, dict) and "$type" in kwargs else list(_mapping(kwargs).items())
        parts += [f"{k}={self.render(v)}" for k, v in pairs]
        return f"{short_class(class_path)}({self._join(parts)})"


def spec_leaf_paths(tree: Mapping[str, object], prefix: str) -> list[str]:
    """Readable paths of an encoded tree's leaves, read from its stored structure alone.

    :func:`modulelens.format.tree.leaf_paths` rebuilds the pytree spec, which imports each
    container type the capture names; this reads the spec as JSON: positions for sequences and
    for containers whose keys it cannot see, the stored keys for dicts. Nothing is imported.

    Args:
        tree: an encoded tree (``{"spec", "leaves"}``).
        prefix: ``"inputs"`` (paths become ``args[0]``, ``kwargs['x']``) or a root name such as
            ``"output"`` (paths become ``output[1]``).

    Returns:
        One path per leaf, in leaf order (positions only when the structure does not add up).
    """
    from modulelens.format.tree import input_path

    leaves = _sequence(tree.get("leaves"))
    keys: list[str] = []
    try:
        _walk_spec(tree.get("spec"), "", keys, 0)
    except (ValueError, TypeError):
        keys = []
    if len(keys) != len(leaves):
        return [f"{prefix}[{i}]" for i in range(len(leaves))]
    return [input_path(k) for k in keys] if prefix == "inputs" else [prefix + k for k in keys]


def spec_leaf_window(tree: Mapping[str, object], prefix: str, start: int, stop: int) -> list[str]:
    """``spec_leaf_paths(tree, prefix)[start:stop]``, naming only those leaves.

    A call may return a million leaves and a page shows a few hundred of them: the structure is
    still walked (to count the leaves before ``start`` and to check that it adds up), but a run of
    plain leaves is counted in one step and only the window's paths are made (a million-leaf list:
    milliseconds, where naming every leaf took seconds).

    Example::

        spec_leaf_window({"spec": {"type": "builtins:list", "children": ["*"] * 3}, "leaves": [1, 2, 3]},
                         "output", 1, 3)   # ['output[1]', 'output[2]']
    """
    from modulelens.format.tree import input_path

    leaves = _sequence(tree.get("leaves"))
    stop = max(0, min(stop, len(leaves)))
    start = max(0, min(start, stop))
    keys: list[str] = []
    try:
        count = _walk_window(tree.get("spec"), "", keys, 0, start, stop, 0)
    except (ValueError, TypeError):
        count = -1
    if count != len(leaves):
        return [f"{prefix}[{i}]" for i in range(start, stop)]
    return [input_path(k) for k in keys] if prefix == "inputs" else [prefix + k for k in keys]


def _walk_window(spec: object, path: str, out: list[str], depth: int, start: int, stop: int, position: int) -> int:
    """Append the paths of the leaves numbered ``[start, stop)`` under ``spec`` (its first leaf is
    number ``position``); return the number after its last leaf."""
    if spec == "*":
        if start <= position < stop:
            out.append(path)
        return position + 1
    if not isinstance(spec, Mapping) or depth > _MAX_SPEC_DEPTH:
        raise ValueError("not a stored tree structure")
    children = spec.get("children")
    if not isinstance(children, list):
        raise ValueError("not a stored tree structure")
    if children.count("*") == len(children):  # a run of plain leaves: counted, and only the window named
        low, high = max(start - position, 0), min(stop - position, len(children))
        if low < high:
            keys = _child_keys(spec, len(children), low, high)
            out.extend(path + key for key in keys)
        return position + len(children)
    for key, child in zip(_child_keys(spec, len(children)), children, strict=True):
        position = _walk_window(child, path + key, out, depth + 1, start, stop, position)
    return position


def _walk_spec(spec: object, path: str, out: list[str], depth: int) -> None:
    if spec == "*":
        out.append(path)
        return
    if not isinstance(spec, Mapping) or depth > _MAX_SPEC_DEPTH:
        raise ValueError("not a stored tree structure")
    children = spec.get("children")
    if not isinstance(children, list):
        raise ValueError("not a stored tree structure")
    for key, child in zip(_child_keys(spec, len(children)), children, strict=True):
        _walk_spec(child, path + key, out, depth + 1)


def _child_keys(spec: Mapping[str, object], count: int, start: int = 0, stop: int | None = None) -> list[str]:
    """``['mask']`` for a dict's children (keys stored in its context), else ``[0]``, ``[1]``...
    (children ``[start, stop)`` only, when given)."""
    stop = count if stop is None else stop
    context = spec.get("context")
    stored = context.get("value") if isinstance(context, Mapping) else None
    mapping = str(spec.get("type", "")).rpartition(":")[2] in ("dict", "OrderedDict")
    if mapping and isinstance(stored, list) and len(stored) == count and all(isinstance(k, (str, int)) for k in stored):
        return [f"[{k!r}]" for k in stored[start:stop]]
    return [f"[{i}]" for i in range(start, stop)]

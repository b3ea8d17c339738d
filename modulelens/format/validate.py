"""Checking capture metadata against the format before anything uses it (docs/format.md).

Metadata may be damaged or hostile, so the reader holds it to the standard safetensors sets for
its header: every field has the right type, every tensor a known dtype, a shape of bounded rank
whose element count times the dtype's size equals its payload's byte count, strides whose reach
stays inside the payload, views of a stored (non-view) entry with the same dtype and a span
inside it; every reference (tensor ids, construction ids, states) points at something that exists,
constructions do not refer to themselves in a cycle, and nesting and counts are bounded. Anything
else is a :class:`CorruptCaptureError` naming the field; nothing here allocates tensors, imports
or calls anything.
"""

from __future__ import annotations

import math
import operator

from modulelens.errors import CorruptCaptureError
from modulelens.format.constants import ADDRESS_ALIGNMENT, FORMAT_NAME, FORMAT_VERSION, NESTED_LAYOUTS, SPARSE_PARTS
from modulelens.format.dtypes import DTYPE_SIZES, QUANTIZED_STORAGE, can_require_grad
from modulelens.format.library_settings import parse_setting
from modulelens.format.validate_fields import DTYPE_NAME, MAX_NDIM, MAX_NUMEL, FieldChecker

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    from typing import Any

    from modulelens.format.spec import CaptureMetadata

MAX_DEPTH = 64  # nesting of encoded values and tree specs
_TAGS_WITH: dict[str, dict[str, type | tuple[type, ...]]] = {  # "$type" -> required fields and their JSON types
    "tensor": {"id": str}, "module": {"ref": str}, "float": {"value": str}, "dtype": {"value": str},
    "device": {"value": str}, "size": {"value": list}, "tuple": {"items": list}, "set": {"items": list},
    "frozenset": {"items": list}, "dict": {"items": list}, "complex": {"real": (int, float), "imag": (int, float)},
    "bytes": {"hex": str}, "slice": {"items": list}, "ellipsis": {}, "import": {"path": str},
    "namedtuple": {"class": str, "items": list}, "dataclass": {"class": str}, "unrecorded": {"class": str},
    "codec": {"codec": str, "class": str}, "sparse": {"layout": str, "size": list}, "nested": {"layout": str},
}
_FLOATS = {"nan", "inf", "-inf", "+inf", "infinity", "-infinity"}


class _Checker(FieldChecker):
    """A capture document (docs/format.md): its tensor table, encoded values and trees, module,
    constructions, states and calls."""

    def __init__(self, meta: dict[str, Any], where: str, *, calls: bool = True) -> None:
        super().__init__(meta, where)
        self.check_calls = calls  # False: each call is checked when it is used (validate_call)
        self.dtypes = DTYPE_SIZES

    # ------------------------------------------------------------------------------ tensors

    def tensors(self) -> None:
        table = self.field(self.meta, "tensors", dict, "capture")
        packs = self.packs()
        for tid, entry in table.items():
            if type(entry) is dict and self.plain_payload(entry) and (
                    "pack" not in entry or (type(entry["pack"]) is int and 0 <= entry["pack"] < packs)):
                continue  # the usual entry, packed or not: no field's name built
            self.tensor(str(tid), self.expect(entry, dict, f"tensors[{tid}]"))
            if "pack" in entry:
                index = self.expect(entry["pack"], int, f"tensors[{tid}].pack")
                if not 0 <= index < packs or "payload" not in entry:
                    raise self.fail(f"tensors[{tid}].pack", f"pack {index} of {packs}, for a tensor with a payload")
        for tid, entry in table.items():
            if "view_of" in entry:
                self.view(tid, entry, table)

    def packs(self) -> int:
        """The packs of small payloads (docs/format.md, "Packs"); returns how many there are."""
        packs = self.field(self.meta, "packs", list, "capture", optional=True) or []
        for i, pack in enumerate(packs):
            entry = self.expect(pack, dict, f"packs[{i}]")
            self.field(entry, "payload", str, f"packs[{i}]")
            if self.field(entry, "nbytes", int, f"packs[{i}]") < 0:
                raise self.fail(f"packs[{i}].nbytes", "negative")
        return len(packs)

    def stored(self) -> None:
        """What a repo reads of a capture of any format version, a newer one included (it lists,
        copies and collects them all): the payloads and sizes of the tensor table, the packs, the
        module's class, the calls, when it was made and its tags."""
        meta = self.meta
        table = self.field(meta, "tensors", dict, "capture")
        packs = self.packs()
        for tid, entry in table.items():
            where = f"tensors[{tid}]"
            self.expect(entry, dict, where)
            if "payload" in entry:
                self.field(entry, "payload", str, where)
                if self.field(entry, "nbytes", int, where) < 0:
                    raise self.fail(f"{where}.nbytes", "negative")
            if "pack" in entry and not 0 <= self.expect(entry["pack"], int, f"{where}.pack") < packs:
                raise self.fail(f"{where}.pack", f"pack {entry['pack']} of {packs}")
        self.field(self.field(meta, "module", dict, "capture"), "class", str, "module")
        self.field(meta, "calls", list, "capture")
        self.field(meta, "created", str, "capture", optional=True)
        for i, tag in enumerate(self.field(meta, "tags", list, "capture", optional=True) or []):
            self.expect(tag, str, f"tags[{i}]")

    def tensor(self, tid: str, entry: dict[str, Any]) -> None:
        where = f"tensors[{tid}]"
        dtype = self.field(entry, "dtype", str, where)
        if dtype not in self.dtypes:
            raise self.fail(f"{where}.dtype", f"unknown dtype {dtype!r}")
        shape = self.dims(self.field(entry, "shape", list, where), f"{where}.shape")
        numel = math.prod(shape)
        if numel > MAX_NUMEL:
            raise self.fail(f"{where}.shape", f"{numel} elements (at most {MAX_NUMEL})")
        nbytes = self.field(entry, "nbytes", int, where)
        stride = entry.get("stride")
        if stride is not None:
            self.dims(self.expect(stride, list, f"{where}.stride"), f"{where}.stride")
            if len(stride) != len(shape):
                raise self.fail(f"{where}.stride", f"{len(stride)} strides for {len(shape)} dimensions")
        kinds = [k for k in ("payload", "view_of", "subclass") if k in entry] + (
            ["shape_only"] if entry.get("shape_only") else [])
        if len(kinds) != 1:
            raise self.fail(where, "must have exactly one of payload, view_of, shape_only, subclass "
                                   f"(has {kinds or 'none'})")
        if self.field(entry, "requires_grad", bool, where, optional=True) and not can_require_grad(dtype):
            raise self.fail(f"{where}.requires_grad", f"requires_grad with dtype {dtype} (only floating point "
                                                      "and complex tensors can require gradients)")
        offset = self.field(entry, "address_offset", int, where, optional=True)
        if offset is not None and not 0 <= offset < ADDRESS_ALIGNMENT:
            raise self.fail(f"{where}.address_offset", f"{offset} is not in [0, {ADDRESS_ALIGNMENT})")
        quantized = self.field(entry, "quantized", dict, where, optional=True)
        if quantized is not None:
            self.quantized(quantized, dtype, f"{where}.quantized")
        if kinds == ["payload"]:
            self.field(entry, "payload", str, where)
            if nbytes != numel * self.dtypes[dtype]:
                raise self.fail(where, f"nbytes {nbytes} != {numel} elements x {self.dtypes[dtype]} bytes ({dtype})")
            if stride is not None and numel and _reach(shape, stride) > numel:
                raise self.fail(f"{where}.stride", f"strides {stride} reach past the {numel} stored elements")
        elif kinds == ["shape_only"]:
            self.stats(self.field(entry, "stats", dict, where, optional=True) or {}, f"{where}.stats")
        elif kinds == ["subclass"]:
            self.subclass(entry["subclass"], f"{where}.subclass")

    def subclass(self, value: object, where: str) -> None:
        """A tensor subclass made of inner tensors (format/layouts.py): its class, its parts (other
        entries of the table) and its context (an encoded value)."""
        data = self.expect(value, dict, where)
        self.field(data, "class", str, where)
        table = self.meta["tensors"]
        for name, part in self.field(data, "parts", dict, where).items():
            if type(part) is not str or part not in table:
                raise self.fail(f"{where}.parts[{name}]", f"{part!r} is not a tensor of the table")
        self.value(data.get("context"), f"{where}.context")
        pending, seen = [data], 0  # parts may be subclasses themselves (torchao nests two), never in a cycle
        while pending:
            seen += 1
            if seen > len(table):
                raise self.fail(f"{where}.parts", "the subclass parts refer to each other in a cycle")
            pending += [table[p]["subclass"] for p in pending.pop()["parts"].values()
                        if isinstance(table.get(p), dict) and isinstance(table[p].get("subclass"), dict)
                        and isinstance(table[p]["subclass"].get("parts"), dict)]

    def stats(self, stats: dict[str, Any], where: str) -> None:
        """A shape-only tensor's recorded statistics (``format/shape_only.tensor_stats``): what a page
        draws, a verdict checks a candidate against and a synthetic stand-in is made from must be
        numbers (finite ones: the statistics are taken over the finite values)."""
        for key in ("numel", "nonfinite"):
            if key in stats and (self.expect(stats[key], int, f"{where}.{key}") < 0):
                raise self.fail(f"{where}.{key}", "negative")
        for key in ("min", "max", "mean", "std", "zero_fraction", "fraction_true"):
            if key in stats:
                self.number(stats[key], f"{where}.{key}")
        for q, value in (self.field(stats, "quantiles", dict, where, optional=True) or {}).items():
            self.number(value, f"{where}.quantiles[{q}]")

    def number(self, value: object, where: str) -> float:
        """A finite JSON number (not a bool)."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise self.fail(where, f"expected a finite number, found {value!r}"[:200])
        return float(value)

    def plain_payload(self, entry: dict[str, Any]) -> bool:
        """Whether ``entry`` is the usual one, a stored payload with its strides and nothing else,
        and passes every check :meth:`tensor` makes of it: checked in a few passes in C, with no
        field's name built (a load of many small tensors checks thousands). ``False`` leaves the
        entry to :meth:`tensor`'s checks one by one, which name what is wrong."""
        shape, stride, dtype, nbytes = entry.get("shape"), entry.get("stride"), entry.get("dtype"), entry.get("nbytes")
        if (type(shape) is not list or type(stride) is not list or len(stride) != len(shape) or len(shape) > MAX_NDIM
                or type(dtype) is not str or dtype not in self.dtypes or type(nbytes) is not int
                or type(entry.get("payload")) is not str or "view_of" in entry or "shape_only" in entry
                or "requires_grad" in entry or "quantized" in entry or "address_offset" in entry):
            return False
        dims = shape + stride
        if set(map(type, dims)) - {int} or (dims and (min(dims) < 0 or max(dims) > MAX_NUMEL)):
            return False
        numel = math.prod(shape)
        return numel <= MAX_NUMEL and nbytes == numel * self.dtypes[dtype] and (not numel or _reach(shape, stride) <= numel)

    def quantized(self, data: dict[str, Any], dtype: str, where: str) -> None:
        if dtype not in QUANTIZED_STORAGE:
            raise self.fail(where, f"a {dtype} tensor is not quantized")
        scheme = self.field(data, "scheme", str, where)
        if scheme == "per_tensor_affine":
            self.field(data, "scale", (int, float), where)
            self.field(data, "zero_point", int, where)
        elif scheme == "per_channel_affine":
            self.field(data, "axis", int, where)
            for key in ("scales", "zero_points"):
                if self.field(data, key, str, where) not in self.meta["tensors"]:
                    raise self.fail(f"{where}.{key}", f"{data[key]!r} is not in the tensor table")
        else:
            raise self.fail(f"{where}.scheme", f"unknown quantization scheme {scheme!r}")

    def view(self, tid: str, entry: dict[str, Any], table: dict[str, Any]) -> None:
        where = f"tensors[{tid}]"
        base_id = self.field(entry, "view_of", str, where)
        base = table.get(base_id)
        if not isinstance(base, dict) or "view_of" in base:
            raise self.fail(f"{where}.view_of", f"{base_id!r} is not a stored tensor of this capture")
        if base["dtype"] != entry["dtype"]:
            raise self.fail(where, f"dtype {entry['dtype']} differs from its base {base_id} ({base['dtype']})")
        stride = entry.get("stride")
        if stride is None:
            raise self.fail(where, "a view needs its strides")
        offset = self.field(entry, "storage_offset", int, where)
        if offset < 0:
            raise self.fail(f"{where}.storage_offset", f"negative ({offset})")
        shape = entry["shape"]
        if math.prod(shape) and offset + _reach(shape, stride) > math.prod(base["shape"]):
            raise self.fail(where, f"the view (offset {offset}, shape {shape}, strides {stride}) reaches past "
                                   f"its base {base_id} ({math.prod(base['shape'])} elements)")

    # ------------------------------------------------------------------------------ values

    def value(self, data: object, where: str, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise self.fail(where, f"nested deeper than {MAX_DEPTH}")
        if data is None or isinstance(data, (bool, int, float, str)):
            return
        if isinstance(data, list):
            for i, item in enumerate(self.expect(data, list, where)):
                self.value(item, f"{where}[{i}]", depth + 1)
            return
        if not isinstance(data, dict):
            raise self.fail(where, f"not an encoded value ({type(data).__name__})")
        tag = data.get("$type")
        if not isinstance(tag, str) or tag not in _TAGS_WITH:
            raise self.fail(where, f"unknown value tag {tag!r}")
        for key, kind in _TAGS_WITH[tag].items():
            self.field(data, key, kind, where)
        self.tagged(tag, data, where, depth)

    def tagged(self, tag: str, data: dict[str, Any], where: str, depth: int) -> None:
        if tag == "tensor" and data["id"] not in self.meta["tensors"]:
            raise self.fail(where, f"tensor {data['id']!r} is not in the tensor table")
        elif tag == "module" and data["ref"] not in self.meta["constructions"]:
            raise self.fail(where, f"construction {data['ref']!r} does not exist")
        elif tag == "float" and data["value"].lower() not in _FLOATS:
            raise self.fail(where, f"{data['value']!r} is not a non-finite float")
        elif tag == "dtype" and not DTYPE_NAME.fullmatch(data["value"]):
            # any torch dtype as a value (qint8, uint4...): the decoder checks torch has it
            raise self.fail(where, f"{data['value']!r} is not a dtype name")
        elif tag == "size":
            self.dims(data["value"], where)
        elif tag in ("tuple", "set", "frozenset", "namedtuple"):
            self.value(data["items"], where, depth + 1)
            if tag in ("set", "frozenset") and not all(_hashable(item) for item in data["items"]):
                raise self.fail(where, "a set holds an unhashable item")
        elif tag == "dict":
            for i, pair in enumerate(data["items"]):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise self.fail(f"{where}.items[{i}]", "not a [key, value] pair")
                self.value(pair, f"{where}.items[{i}]", depth + 1)
                if not _hashable(pair[0]):
                    raise self.fail(f"{where}.items[{i}]", "an unhashable dict key")
        elif tag == "slice" and len(data["items"]) != 3:
            raise self.fail(where, "a slice has three items")
        elif tag == "slice":
            self.value(data["items"], where, depth + 1)
        elif tag == "bytes" and (len(data["hex"]) % 2 or any(c not in "0123456789abcdefABCDEF" for c in data["hex"])):
            raise self.fail(where, "not hex bytes")
        elif tag == "dataclass":
            self.value(data.get("fields"), where, depth + 1)
        elif tag == "codec":
            self.value(data.get("value"), where, depth + 1)
        elif tag in ("sparse", "nested"):
            self.layout(tag, data, where)

    def layout(self, tag: str, data: dict[str, Any], where: str) -> None:
        """A sparse or nested tensor: a known layout whose parts are stored tensors (format/layouts.py)."""
        layout = data["layout"]
        if tag == "sparse":
            if layout not in SPARSE_PARTS:
                raise self.fail(where, f"unknown sparse layout {layout!r}")
            self.dims(data["size"], f"{where}.size")
            names: list[str] = list(SPARSE_PARTS[layout])
            self.field(data, "coalesced", bool, where, optional=True)
        elif layout not in NESTED_LAYOUTS:
            raise self.fail(where, f"unknown nested layout {layout!r}")
        elif layout == "jagged":
            names = ["values", "offsets"] + (["lengths"] if data.get("lengths") is not None else [])
            self.field(data, "ragged_idx", int, where)
            for key in ("min_seqlen", "max_seqlen"):
                if data.get(key) is not None:
                    self.field(data, key, int, where)
        else:
            components = self.field(data, "components", list, where)
            names = []
            for i, component in enumerate(components):
                self.tensor_ref(component, f"{where}.components[{i}]")
        for name in names:
            if name not in data:
                raise self.fail(where, f"missing {name!r}")
            self.tensor_ref(data[name], f"{where}.{name}")

    def tensor_ref(self, data: object, where: str) -> None:
        if not isinstance(data, dict) or data.get("$type") != "tensor":
            raise self.fail(where, "not a stored tensor")
        self.value(data, where)

    def tree(self, value: object, where: str) -> None:
        data = self.expect(value, dict, where)
        leaves = self.field(data, "leaves", list, where)
        count = self.spec(data.get("spec"), f"{where}.spec", 0)
        if count != len(leaves):
            raise self.fail(where, f"the structure has {count} leaves but {len(leaves)} are stored")
        self.value(leaves, f"{where}.leaves")

    def spec(self, node: object, where: str, depth: int) -> int:
        if node == "*":
            return 1
        if depth > MAX_DEPTH:
            raise self.fail(where, f"nested deeper than {MAX_DEPTH}")
        spec = self.expect(node, dict, where)
        self.field(spec, "type", str, where)
        context = self.field(spec, "context", dict, where)
        if "value" in context:
            self.value(context["value"], f"{where}.context", depth + 1)
        elif "dumpable" not in context:
            raise self.fail(f"{where}.context", "has neither 'value' nor 'dumpable'")
        children = self.field(spec, "children", list, where)
        self.container(spec["type"], context, len(children), where)
        return sum(self.spec(child, f"{where}.children[{i}]", depth + 1) for i, child in enumerate(children))

    def container(self, node_type: str, context: dict[str, Any], children: int, where: str) -> None:
        """The built-in containers' contexts: none for tuple/list, one key per child for dicts."""
        value = context.get("value")
        if node_type in ("builtins:tuple", "builtins:list") and value is not None:
            raise self.fail(f"{where}.context", f"a {node_type} has no context")
        if node_type in ("builtins:dict", "collections:OrderedDict") and (
                not isinstance(value, list) or len(value) != children):
            raise self.fail(f"{where}.context", f"a {node_type} needs one key per child ({children})")

    # ------------------------------------------------------------------------------ document

    def document(self) -> None:
        meta = self.meta
        if meta.get("format", FORMAT_NAME) != FORMAT_NAME:
            raise self.fail("format", f"{meta.get('format')!r} is not {FORMAT_NAME!r}")
        self.field(meta, "format_version", int, "capture")
        self.tensors()
        constructions = self.field(meta, "constructions", dict, "capture")
        module = self.field(meta, "module", dict, "capture")
        self.field(module, "class", str, "module")
        mid = self.field(module, "construction", (str, type(None)), "module", optional=True)
        if mid is not None and mid not in constructions:
            raise self.fail("module.construction", f"{mid!r} does not exist")
        method = self.field(module, "method", str, "module", optional=True)
        if method is not None and not (method.isidentifier() and (method == "__call__" or not method.startswith("__"))):
            # replay calls it on the rebuilt module: a plain method name, never another dunder
            raise self.fail("module.method", f"{method!r} is not a method name replay may call")
        self.module_state(module)
        for cid, entry in constructions.items():
            where = f"constructions[{cid}]"
            self.expect(entry, dict, where)
            self.field(entry, "class", str, where)
            self.value(self.field(entry, "args", list, where), f"{where}.args")
            self.value(list(self.field(entry, "kwargs", dict, where).values()), f"{where}.kwargs")
            if "state" in entry:  # rebuilt from its recorded attributes (restore/rebuild.py)
                self.value(entry["state"], f"{where}.state")
                for name in self.field(entry, "parameters", list, where):
                    self.expect(name, str, f"{where}.parameters")
                for name, persistent in self.field(entry, "buffers", dict, where).items():
                    self.expect(persistent, bool, f"{where}.buffers[{name}]")
                self.field(entry, "why", str, where, optional=True)
        self.acyclic(constructions)
        self.states()
        if self.check_calls:
            self.calls()
        else:
            self.field(meta, "calls", list, "capture")
        for key, kind in (("unrecorded", list), ("shape_only", list), ("sources", dict), ("capture", dict),
                          ("environment", dict), ("metadata", dict), ("tags", list), ("provenance", dict)):
            self.field(meta, key, kind, "capture", optional=True)
        for name, entry in (meta.get("sources") or {}).items():
            where = f"sources[{name}]"
            self.expect(entry, dict, where)
            for key in ("text", "file", "hash"):
                self.field(entry, key, (str, type(None)), where, optional=True)
            text_id = self.field(entry, "text_id", str, where, optional=True)
            if text_id is not None and (text_id not in meta["tensors"] or meta["tensors"][text_id]["dtype"] != "uint8"
                                        or len(meta["tensors"][text_id]["shape"]) != 1):
                raise self.fail(f"{where}.text_id", f"{text_id!r} is not a 1-D uint8 entry of the tensor table")
            for qualname, info in (self.field(entry, "classes", dict, where, optional=True) or {}).items():
                self.expect(info, dict, f"{where}.classes[{qualname}]")
                for key in ("text", "hash"):
                    self.field(info, key, (str, type(None)), f"{where}.classes[{qualname}]", optional=True)

    def module_state(self, module: dict[str, Any]) -> None:
        """``module.structure`` (path -> class name) and ``module.attributes`` (path -> {name: plain
        value}), recorded at the first call (docs/format.md)."""
        structure = self.field(module, "structure", dict, "module", optional=True) or {}
        for path, name in structure.items():
            self.expect(name, str, f"module.structure[{path}]")
        self.module_tree(self.field(module, "tree", dict, "module", optional=True) or {})
        attributes = self.field(module, "attributes", dict, "module", optional=True) or {}
        for path, values in attributes.items():
            self.expect(values, dict, f"module.attributes[{path}]")
            self.value(list(values.values()), f"module.attributes[{path}]")

    def module_tree(self, tree: dict[str, Any]) -> None:
        """``module.tree`` (format 2): per submodule path, its class and construction (or why it has
        none), or the earlier path of the same module; parametrizations, norm hooks, hooks."""
        constructions = self.meta.get("constructions", {})
        for path, entry in tree.items():
            where = f"module.tree[{path!r}]"
            self.expect(entry, dict, where)
            if "same_as" in entry:
                if entry["same_as"] not in tree or "same_as" in tree[entry["same_as"]]:
                    raise self.fail(f"{where}.same_as", f"{entry['same_as']!r} is not a path of the tree")
                continue
            self.built(entry, where, constructions)
            self.field(entry, "compiled", bool, where, optional=True)
            self.field(entry, "made_by", str, where, optional=True)
            settings = self.field(entry, "compile", dict, where, optional=True)
            if settings is not None:  # a load compiles again only with settings module_state.reproducible_compile takes
                self.field(settings, "backend", (str, type(None)), f"{where}.compile")
                for key, value in (self.field(settings, "options", dict, f"{where}.compile", optional=True) or {}).items():
                    self.expect(value, bool, f"{where}.compile.options[{key}]")
            self.field(entry, "traced_training", bool, where, optional=True)
            self.field(entry, "forward_replaced", str, where, optional=True)
            for name, chain in (self.field(entry, "parametrizations", dict, where, optional=True) or {}).items():
                self.expect(chain, dict, f"{where}.parametrizations[{name}]")
                self.field(chain, "unsafe", bool, f"{where}.parametrizations[{name}]")
                for i, piece in enumerate(self.field(chain, "modules", list, f"{where}.parametrizations[{name}]")):
                    self.built(self.expect(piece, dict, f"{where}.parametrizations[{name}][{i}]"),
                               f"{where}.parametrizations[{name}][{i}]", constructions)
            for i, hook in enumerate(self.field(entry, "reapply", list, where, optional=True) or []):
                here = f"{where}.reapply[{i}]"
                self.expect(hook, dict, here)
                if hook.get("kind") not in ("weight_norm", "spectral_norm", "prune", "hook", "accelerate"):
                    raise self.fail(here, f"unknown hook to apply again {hook.get('kind')!r}")
                if hook["kind"] == "accelerate":
                    self.value(self.field(hook, "hooks", list, here), f"{here}.hooks")
                    continue
                if hook["kind"] == "hook":
                    self.field(hook, "hook", str, here)
                    if self.field(hook, "on", str, here) not in ("forward", "forward_pre"):
                        raise self.fail(f"{here}.on", f"{hook['on']!r} is not forward or forward_pre")
                    continue
                self.field(hook, "name", str, here)
                if hook["kind"] == "prune":
                    continue
                self.field(hook, "dim", int, here)
                if hook["kind"] == "spectral_norm":
                    self.field(hook, "eps", (int, float), here)
                    self.field(hook, "n_power_iterations", int, here)
            for i, hook in enumerate(self.field(entry, "hooks", list, where, optional=True) or []):
                here = f"{where}.hooks[{i}]"
                self.expect(hook, dict, here)
                for key, kind in (("kind", str), ("hook", str), ("rebuilt", bool)):
                    self.field(hook, key, kind, here)

    def built(self, entry: dict[str, Any], where: str, constructions: dict[str, Any]) -> None:
        """A module as a tree records it: its class and construction id, or ``null`` and why."""
        self.field(entry, "class", str, where)
        mid = self.field(entry, "construction", (str, type(None)), where)
        if mid is not None and mid not in constructions:
            raise self.fail(f"{where}.construction", f"{mid!r} does not exist")
        self.field(entry, "missing", str, where, optional=True)

    def states(self) -> None:
        tensors = self.meta["tensors"]
        for i, state in enumerate(self.field(self.meta, "states", list, "capture")):
            where = f"states[{i}]"
            self.expect(state, dict, where)
            for part, flag in (("parameters", "requires_grad"), ("buffers", "persistent")):
                for name, entry in self.field(state, part, dict, where).items():
                    self.expect(entry, dict, f"{where}.{part}[{name}]")
                    tid = self.field(entry, "tensor", str, f"{where}.{part}[{name}]")
                    self.field(entry, flag, bool, f"{where}.{part}[{name}]")
                    if tid not in tensors:
                        raise self.fail(f"{where}.{part}[{name}]", f"tensor {tid!r} is not in the tensor table")
                    if flag == "requires_grad" and entry[flag] and not can_require_grad(tensors[tid]["dtype"]):
                        raise self.fail(f"{where}.{part}[{name}]", f"requires_grad with dtype {tensors[tid]['dtype']} "
                                                                    "(only floating point and complex tensors can)")
            extra = self.field(state, "extra_state", dict, where, optional=True) or {}
            self.value(list(extra.values()), f"{where}.extra_state")
            for path, values in (self.field(state, "module_state", dict, where, optional=True) or {}).items():
                self.value(list(self.expect(values, dict, f"{where}.module_state[{path}]").values()),
                           f"{where}.module_state[{path}]")
            for name, entry in (self.field(state, "rebuilt_buffers", dict, where, optional=True) or {}).items():
                self.expect(entry, dict, f"{where}.rebuilt_buffers[{name}]")
                for key in ("layout", "digest"):
                    self.field(entry, key, str, f"{where}.rebuilt_buffers[{name}]")

    def calls(self) -> None:
        for i, call in enumerate(self.field(self.meta, "calls", list, "capture")):
            self.call(i, call)

    def call(self, i: int, entry: object) -> None:
        """``calls[i]``: its flags, state, trees, gradients, RNG states, vmap and op trace summary."""
        states = len(self.meta["states"])
        where = f"calls[{i}]"
        call = self.expect(entry, dict, where)
        self.field(call, "index", int, where)
        state = self.field(call, "state", int, where)
        if states and not 0 <= state < states:
            raise self.fail(f"{where}.state", f"{state} is not one of the {states} recorded states")
        for flag in ("training", "grad_enabled"):
            self.field(call, flag, bool, where)
        self.tree(call.get("inputs"), f"{where}.inputs")
        self.inputs_shape(call["inputs"]["spec"], f"{where}.inputs")
        if call.get("output") is not None:
            self.tree(call["output"], f"{where}.output")
        for key in ("mutated_inputs", "buffers_after"):
            if call.get(key) is not None:
                self.tree(call[key], f"{where}.{key}")
        backward = self.field(call, "backward", (dict, type(None)), where, optional=True)
        for key in ("output_grads", "input_grads", "param_grads") if backward else ():
            self.tree(backward.get(key), f"{where}.backward.{key}")
        for device, tid in (self.field(call, "rng", dict, where, optional=True) or {}).items():
            if not isinstance(tid, str) or tid not in self.meta["tensors"]:
                raise self.fail(f"{where}.rng[{device}]", f"{tid!r} is not in the tensor table")
        self.field(call, "autocast", dict, where, optional=True)
        for key, value in (self.field(call, "settings", dict, where, optional=True) or {}).items():
            try:
                parse_setting(key, value)
            except CorruptCaptureError as error:  # (a listing passes over such a version, as over a damaged one)
                raise self.fail(f"{where}.settings", str(error)) from None
        self.vmap(self.field(call, "vmap", dict, where, optional=True), f"{where}.vmap")
        trace = self.field(call, "op_trace", dict, where, optional=True)
        if trace is not None:
            self.op_trace_summary(trace, f"{where}.op_trace")

    def vmap(self, batched: dict[str, Any] | None, where: str) -> None:
        """``calls[i].vmap`` (format 3): what replay hands ``torch.func.vmap``."""
        if batched is None:
            return
        if self.field(batched, "size", int, where) < 1:
            raise self.fail(f"{where}.size", "must be at least 1")
        if self.field(batched, "randomness", str, where) not in ("error", "different", "same"):
            raise self.fail(f"{where}.randomness", f"{batched['randomness']!r} is not a vmap randomness")
        for key in ("inputs", "state", "output"):
            for item in self.field(batched, key, list, where):
                self.expect(item, str, f"{where}.{key}[]")

    def op_trace_summary(self, trace: dict[str, Any], where: str) -> None:
        """``calls[i].op_trace``: the trace is a 1-D uint8 blob of the table; its counts are numbers."""
        text_id = self.field(trace, "text_id", str, where)
        entry = self.meta["tensors"].get(text_id)
        if not isinstance(entry, dict) or entry.get("dtype") != "uint8" or len(entry.get("shape", ())) != 1 \
                or "payload" not in entry:
            raise self.fail(f"{where}.text_id", f"{text_id!r} is not a 1-D uint8 payload of the tensor table")
        for key in ("ops", "modules", "values"):
            if self.field(trace, key, int, where) < 0:
                raise self.fail(f"{where}.{key}", "negative")
        for key in ("truncated", "values_dropped"):
            if (self.field(trace, key, int, where, optional=True) or 0) < 0:
                raise self.fail(f"{where}.{key}", "negative")

    def inputs_shape(self, spec: object, where: str) -> None:
        """Call inputs are stored as the tree ``(args_tuple, kwargs_dict)``."""
        types = [c.get("type") if isinstance(c, dict) else c for c in spec.get("children", [])] \
            if isinstance(spec, dict) else []
        if not isinstance(spec, dict) or spec.get("type") != "builtins:tuple" \
                or types != ["builtins:tuple", "builtins:dict"]:
            raise self.fail(where, "call inputs must be the tree (args tuple, kwargs dict)")

    def acyclic(self, constructions: dict[str, Any]) -> None:
        """Constructions refer to nested modules' constructions; a cycle would never end, and
        rebuilding recurses once per level, so a chain is at most ``MAX_DEPTH`` deep."""
        refs = {cid: [c for c in _module_refs(entry) if c in constructions] for cid, entry in constructions.items()}
        height: dict[str, int] = {}  # levels of nested constructions below and including each one
        for start in refs:
            if start in height:
                continue
            stack = [(start, iter(refs[start]))]
            on_path = {start}
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    on_path.discard(node)
                    height[node] = 1 + max((height[c] for c in refs[node]), default=0)
                    if height[node] > MAX_DEPTH:
                        raise self.fail(f"constructions[{node}]", f"nests modules more than {MAX_DEPTH} levels deep")
                    continue
                if child in on_path:
                    raise self.fail(f"constructions[{child}]", "refers to itself through nested modules")
                if child not in height:
                    on_path.add(child)
                    stack.append((child, iter(refs[child])))


def _hashable(data: object) -> bool:
    """Whether an (already checked) encoded value decodes to something hashable."""
    if isinstance(data, list):
        return False
    if not isinstance(data, dict):
        return True
    if data["$type"] in ("dict", "set"):
        return False
    if data["$type"] in ("tuple", "frozenset", "namedtuple"):
        return all(_hashable(item) for item in data["items"])
    return True


def _module_refs(data: object) -> list[str]:
    found: list[str] = []
    pending = [data]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if item.get("$type") == "module" and isinstance(item.get("ref"), str):
                found.append(item["ref"])
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def _reach(shape: list[int], stride: list[int]) -> int:
    """Elements a strided layout spans: 1 + the offset of its last element."""
    if 0 not in shape and len(shape) == len(stride):  # the usual layout, summed in C
        return 1 + sum(map(operator.mul, shape, stride)) - sum(stride)
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=False) if size > 0)


def validate_capture(data: object, where: str, *, calls: bool = True) -> CaptureMetadata:
    """``data`` as capture metadata, after checking it against the format.

    Args:
        data: the parsed ``capture.json``.
        where: names the document in errors (its path or ref).
        calls: check every recorded call too. ``False`` checks only that ``calls`` is a list, for a
            reader that shows a few calls of many and checks each one it uses with
            :func:`validate_call` (the web UI: 50,000 calls took 0.55 s to check, a page shows 20).

    Returns:
        The same object, typed (of a document of a newer format version, only what a repo reads of
        every capture is checked (:meth:`_Checker.stored`): it still lists, copies and is collected,
        and readers refuse it with an "upgrade modulelens" error of their own).

    Raises:
        CorruptCaptureError: the first problem found, naming its field.

    Example::

        meta = validate_capture(json.loads(path.read_text()), str(path))
    """
    if not isinstance(data, dict) or "format_version" not in data:
        raise CorruptCaptureError(f"{where}: not a modulelens capture")
    if isinstance(data["format_version"], int) and data["format_version"] > FORMAT_VERSION:
        _Checker(data, where).stored()  # a newer format: the loader refuses it by name
        return _as_metadata(data)
    try:
        _Checker(data, where, calls=calls).document()
    except RecursionError:
        raise CorruptCaptureError(f"{where}: nested too deeply") from None
    return _as_metadata(data)


def _as_metadata(checked: Any) -> CaptureMetadata:
    """A checked document as the TypedDict it now is (``typing.cast`` without importing typing)."""
    return checked


def validate_call(data: CaptureMetadata | dict[str, Any], position: int, where: str) -> dict[str, Any]:
    """Recorded call ``position`` of metadata checked by ``validate_capture(..., calls=False)``,
    after checking it as :func:`validate_capture` checks every call.

    Args:
        data: the capture's metadata (the tensor table and states it refers to are checked).
        position: the call's place in ``calls`` (0-based; the caller checks the range).
        where: names the document in errors.

    Returns:
        The call's record.

    Raises:
        CorruptCaptureError: the call's first problem, naming its field.

    Example::

        meta = validate_capture(json.loads(text), "mlp:v3", calls=False)
        first = validate_call(meta, 0, "mlp:v3")
    """
    document: Any = data  # a TypedDict is no dict[str, Any] to mypy: the checker reads it as JSON
    call: Any = document["calls"][position]
    try:
        _Checker(document, where).call(position, call)
    except RecursionError:
        raise CorruptCaptureError(f"{where}: calls[{position}]: nested too deeply") from None
    return call

"""A capture's module rebuilt: the original class from its construction record, then its recorded
parameters, buffers, extra state and plain attributes.

The module is constructed on the meta device (no memory, no initialisation work) and given its
recorded tensors as memory-mapped, copy-on-write views of the payload blobs, so even a multi-GB
module is ready in milliseconds. A constructor that computes with real tensors, or keeps tensors
outside its parameters and buffers, is constructed again on the CPU.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]  # torch's parameter.pyi omits it

from modulelens.errors import CorruptCaptureError, ModulelensError, RestoreError, UsageError
from modulelens.format.metric_states import metric_versions, own_copy, own_metric_states
from modulelens.format.module_state import REREGISTERED_HOOKS, reproducible_compile, structure, structure_difference
from modulelens.format.spec import CaptureMetadata, Construction, StateEntry, TreeEntry, hooks_not_rebuilt
from modulelens.format.values import DecodeContext, decode_value
from modulelens.restore.classes import (
    ClassResolver,
    construction_paths,
    decode_construction,
    holds_graph,
    module_class,
)
from modulelens.restore.construction import empty_weights, random_state_kept


@dataclass(frozen=True)
class RebuildOptions:
    """How ``load()`` was asked to rebuild: arguments given instead of the recorded ones, single
    recorded arguments replaced, and where the module goes."""

    init_args: tuple[Any, ...] | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    init_overrides: dict[str, Any] = field(default_factory=dict)
    device: torch.device | None = None
    dtype: torch.dtype | None = None

    @property
    def given_arguments(self) -> bool:
        return self.init_args is not None or bool(self.init_kwargs)


class Rebuilder:
    """Builds one capture's module and loads its recorded states into it.

    Args:
        ref: the capture's reference, for messages.
        metadata: the capture's (validated) metadata.
        resolver: the capture's class resolver (its trust rules).
        open_tensor: a new copy-on-write mapping of a recorded tensor, by id.
        decode_context: the capture's value decoding (tensors, and modules built by :meth:`construct`).
        notes: the capture's notes, appended to.
        options: see :class:`RebuildOptions`.
    """

    def __init__(self, ref: str, metadata: CaptureMetadata, resolver: ClassResolver,
                 open_tensor: Callable[[str], torch.Tensor], decode_context: Callable[[], DecodeContext],
                 notes: list[str], options: RebuildOptions) -> None:
        self.ref = ref
        self.metadata = metadata
        self.resolver = resolver
        self.open_tensor = open_tensor
        self.decode_context = decode_context
        self.notes = notes
        self.options = options
        self.current_state: tuple[int, tuple[int, ...]] | None = None  # (state index, tensor versions)
        self.traced_modes: dict[str, bool] = {}  # paths torch.jit.trace made -> the mode they were traced in

    # ------------------------------------------------------------------------------ arguments

    @property
    def module_class_path(self) -> str:
        return self.metadata["module"]["class"]

    def module_type(self) -> type[torch.nn.Module]:
        try:
            return module_class(self.resolver, self.module_class_path)
        finally:
            self.collect_source_notes()

    def init_arguments(self) -> tuple[tuple[object, ...], dict[str, object]] | None:
        """See :attr:`modulelens.Capture.init_arguments`."""
        options = self.options
        if options.given_arguments:
            return tuple(options.init_args or ()), dict(options.init_kwargs)
        mid = self.metadata["module"].get("construction")
        if mid is None or "state" in self.metadata["constructions"][mid]:  # no arguments: its attributes
            return None
        cls, args, kwargs = self.decode_construction(mid)
        if options.init_overrides:
            return override_arguments(cls, args, kwargs, options.init_overrides, self.ref)
        return args, kwargs

    def decode_construction(self, mid: str) -> tuple[type[torch.nn.Module], tuple[object, ...], dict[str, object]]:
        try:
            return decode_construction(self.metadata["constructions"][mid], self.resolver, self.decode_context())
        finally:
            self.collect_source_notes()

    def construct(self, mid: str) -> torch.nn.Module:
        """A new module from construction record ``mid`` (the decoding of a ``module`` value)."""
        entry = self.metadata["constructions"][mid]
        if "state" in entry:
            return self._from_attributes(entry)
        cls, args, kwargs = self.decode_construction(mid)
        return cls(*args, **kwargs)

    def _from_attributes(self, entry: Construction) -> torch.nn.Module:
        """A module whose recorded arguments could not be stored (a closure), rebuilt from its
        recorded attributes: ``cls.__new__``, ``nn.Module.__init__``, the attributes set back as they
        were, its parameters and buffers registered by name as meta placeholders for the recorded
        state; its children come from their own records (the tree). Its constructor does not run,
        so nothing it would do besides (a hook it registers) happens: the notes say how it was built."""
        cls = module_class(self.resolver, entry["class"])
        try:
            attributes = decode_value(entry["state"], self.decode_context())
        finally:
            self.collect_source_notes()
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.__dict__.update(attributes)
        for name in entry.get("parameters", []):
            module._parameters[name] = torch.nn.Parameter(torch.empty(0, device="meta"))
        for name, persistent in entry.get("buffers", {}).items():
            module._buffers[name] = torch.empty(0, device="meta")
            if not persistent:
                module._non_persistent_buffers_set.add(name)
        note = (f"{cls.__qualname__} rebuilt from its recorded attributes, parameters, buffers and submodules, not "
                f"by its constructor, which did not run ({entry.get('why', '')})")
        if note not in self.notes:
            self.notes.append(note)
        return module

    def collect_source_notes(self) -> None:
        for note in self.resolver.notes:
            if note not in self.notes:
                self.notes.append(note)

    # ------------------------------------------------------------------------------ module

    def build(self) -> torch.nn.Module:
        """The module, with recorded state 0 and the recorded attributes, on the asked device/dtype.

        The classes and functions the capture names are imported first (and stored source that
        trust allows runs), then the constructors run with only their parameters and buffers on
        the meta device and the random generators kept (restore/construction.py): a load changes
        nothing in the process outside the module it returns."""
        module_info = self.metadata["module"]
        self.resolver.prefetch([module_info["class"], *construction_paths(self.metadata.get("constructions", {}),
                                                                          module_info.get("construction"))])
        with random_state_kept():
            module = self._build_with_state()
            self._restore_attributes(module)
        _keep_traced_modes(module, self.traced_modes)
        self._compile_again(module)
        missing_hooks = hooks_not_rebuilt(self.metadata["module"])
        if missing_hooks:
            shown = "; ".join(missing_hooks[:5]) + (f" and {len(missing_hooks) - 5} more" if len(missing_hooks) > 5 else "")
            self.notes.append(f"hooks the job added after construction are not rebuilt, so the module runs without "
                              f"them: {shown}")
        options = self.options
        if options.device is not None and options.device.type != "cpu":
            module.to(options.device)
        if options.dtype is not None:
            module.to(options.dtype)
        self.collect_source_notes()
        return module

    def _build_with_state(self) -> torch.nn.Module:
        """The module constructed with empty weights and given recorded state 0; constructed on the
        CPU instead when its constructor computes with its weights or keeps tensors elsewhere."""
        try:
            with empty_weights() as emptied:
                module = self._construct()
                self._reassemble(module)
            self.assign_state(module, 0, live=False)
            if self._may_have_norm_hooks():
                _refresh_norm_weights(module)
            if _has_meta_tensors(module):
                raise _NeedsRealConstructionError("tensors outside parameters and buffers")
            outside = emptied.outside(module)
            if outside:
                raise _NeedsRealConstructionError(f"it keeps a {type(outside[0]).__name__} outside its submodules")
        except _NeedsRealConstructionError as why:
            self.notes.append(_built_on_cpu(str(why)))
            module = self._construct_on_cpu()
        except (RestoreError, UsageError):
            raise
        except Exception as error:  # the constructor did real computation on meta tensors
            first = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
            self.notes.append(_built_on_cpu(f"its constructor computes with its weights: {type(error).__name__}"
                                            + (f": {first}" if first else "")))
            module = self._construct_on_cpu()
        return module

    @functools.cached_property
    def _builds_graphs(self) -> bool:
        """Whether a construction of the capture is a GraphModule's (tracing/graph_modules.py)."""
        return any(holds_graph([entry.get("args"), entry.get("kwargs")])
                   for entry in self.metadata.get("constructions", {}).values())

    def _may_have_norm_hooks(self) -> bool:
        """Whether the rebuilt module may carry ``weight_norm``/``spectral_norm`` hooks: the recorded
        tree lists every one the job's module had (walking every module's hooks to find none cost a
        1 GiB load about 0.1 ms); a capture without a tree, or other arguments than the recorded, may."""
        tree = self.metadata["module"].get("tree")
        return not tree or self.options.given_arguments or any("reapply" in entry for entry in tree.values())

    def _construct(self) -> torch.nn.Module:
        module_info = self.metadata["module"]
        options = self.options
        if options.given_arguments:
            return self.module_type()(*(options.init_args or ()), **options.init_kwargs)
        construction = module_info.get("construction")
        if construction is None:
            reason = module_info.get("construction_missing", "no constructor record")
            raise RestoreError(
                f"{self.ref}: cannot rebuild {module_info['class']}: {reason}; "
                "pass its arguments with load(..., init_args=(...), init_kwargs={...})"
            )
        if options.init_overrides:
            arguments = self.init_arguments()
            if arguments is None:
                raise UsageError(f"{self.ref}: init_overrides needs recorded constructor arguments, and "
                                 f"{module_info['class']} is rebuilt from its recorded attributes "
                                 f"({module_info.get('construction_missing', '')})")
            return self.module_type()(*arguments[0], **arguments[1])
        return self.construct(construction)

    def _construct_on_cpu(self) -> torch.nn.Module:
        try:
            module = self._construct()
        except (RestoreError, UsageError, KeyboardInterrupt):
            raise
        except Exception as error:  # the class's own code rejected the recorded arguments
            raise RestoreError(f"{self.ref}: rebuilding {self.module_class_path} from its recorded arguments failed: "
                               f"{type(error).__name__}: {error}") from error
        self._reassemble(module)
        self.assign_state(module, 0, live=False)
        _refresh_norm_weights(module)
        return module

    # ------------------------------------------------------------------------------ structure

    def _reassemble(self, module: torch.nn.Module) -> None:
        """Make ``module`` (just constructed from its record) the tree recorded at capture
        (``module.tree``, docs/format.md): walking the recorded submodules parents first, a child
        the constructor did not build as it ran in the job (another class, other weights: peft's
        LoRA layers, ``quantize_dynamic``'s Linears, a child replaced after construction) is
        constructed from its own record and put where it was, recorded parametrizations and
        norm hooks are applied again, and children the job no longer had are removed. Only a
        piece that is needed and has no record fails, naming it."""
        tree = self.metadata["module"].get("tree")
        if not tree:
            return
        states = self.metadata.get("states", [])
        direct = _direct_state(states[0]) if states else None
        built: dict[str, torch.nn.Module] = {"": module}
        changed: list[str] = []
        for path, entry in tree.items():
            if path == "":
                self._put_back(module, entry, path, changed)
                continue
            parent_path, _, name = path.rpartition(".")
            parent = built.get(parent_path)
            if parent is None:  # under a piece that could not be put back (reported there)
                continue
            if "same_as" in entry:
                shared = built.get(entry["same_as"])
                if shared is not None and parent._modules.get(name) is not shared:
                    _put(parent, name, shared)
                if shared is not None:
                    built[path] = shared
                continue
            current = parent._modules.get(name)
            if current is not None and (self._built_as(current, entry["class"]) or self._built_as_recorded(current, entry)):
                self._put_back(current, entry, path, changed)
                if direct is not None and not _same_direct_state(current, direct.get(path, {}), self.metadata):
                    current = None  # the same class, other parameters: built afresh
            else:
                current = None
            if current is None:
                current = self._piece(entry, path)
                self._put_back(current, entry, path, changed)
                _put(parent, name, current)
                changed.append(path)
            built[path] = current
        for path, owner in list(built.items()):
            if "same_as" in tree.get(path, {}):  # a shared module: the tree lists its children at its first path only
                continue
            # a None child (Informer's ModuleList of conv layers ends in None) is no module, so the tree
            # has no entry for it; removing it shortened the list and zip() in forward dropped a layer
            for name in [n for n, child in owner._modules.items() if child is not None and n != "parametrizations"]:
                child_path = f"{path}.{name}" if path else name
                if child_path not in tree:  # the job's module no longer had it
                    del owner._modules[name]
                    changed.append(f"{child_path} (removed)")
        if changed:
            shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            self.notes.append(f"structure changed after construction rebuilt from the recorded submodules: {shown}")
        self._note_tool_made(tree)

    def _note_tool_made(self, tree: dict[str, TreeEntry]) -> None:
        """Say which submodules a tool made from an eager module are rebuilt as that module
        (TorchScript: the same operations, run eagerly; init_tracking._record_scripted)."""
        made: dict[str, list[str]] = {}
        for path, entry in tree.items():
            if isinstance(entry.get("made_by"), str):
                made.setdefault(entry["made_by"], []).append(path or "<root>")
        traced = {path: entry["traced_training"] for path, entry in tree.items()
                  if isinstance(entry.get("traced_training"), bool)}
        if traced:
            self.traced_modes = traced
        for tool, paths in made.items():
            shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            self.notes.append(f"rebuilt as the eager modules {tool} made them from (they run the same operations "
                              f"eagerly): {shown}")

    def _compile_again(self, module: torch.nn.Module) -> None:
        """Compile the modules that ran ``torch.compile``d as the job compiled them (in place:
        ``module.compile(...)``), so a replay runs the kernels the job ran (tracing/compiled.py);
        settings a load does not reproduce leave the module eager, with a note."""
        compiled, eager = [], []
        for path, entry in (self.metadata["module"].get("tree") or {}).items():
            settings = entry.get("compile")
            if settings is None:
                continue
            if not reproducible_compile(settings):
                eager.append(path or "<root>")
                continue
            try:
                sub = module.get_submodule(path) if path else module
            except AttributeError:
                continue
            sub.compile(backend=settings["backend"], options=settings.get("options") or None,
                        dynamic=settings.get("dynamic"), fullgraph=settings.get("fullgraph", False))
            compiled.append(f"{path or '<root>'} ({settings['backend']})")
        if compiled:
            self.notes.append(f"compiled as the job compiled them (torch.compile, on the first call): {', '.join(compiled)}")
        if eager:
            self.notes.append(f"ran torch.compile'd in the job with settings a load does not reproduce, so they run "
                              f"eagerly (results may round differently): {', '.join(eager)}")

    def _built_as(self, module: torch.nn.Module, class_path: str) -> bool:
        """Whether ``module`` is of the recorded class ``class_path``: by name, or, for a class
        rebuilt from stored source (whose module is not the recorded one), the class it resolves to."""
        if _class_path(module) == class_path:
            return True
        try:
            return _constructed_type(module) is self.resolver.resolve(class_path, "module")
        except ModulelensError:  # not resolvable here: the piece is built from its record, which says why
            return False

    def _built_as_recorded(self, module: torch.nn.Module, entry: TreeEntry) -> bool:
        """Whether ``module`` is of the class the piece's own construction record builds (a graph a
        tool made is rebuilt as a GraphModule: tracing/graph_modules.py)."""
        construction = self.metadata.get("constructions", {}).get(entry.get("construction") or "")
        return construction is not None and _class_path(module) == construction["class"]

    def _piece(self, entry: TreeEntry, path: str) -> torch.nn.Module:
        """A submodule built from its own construction record, or a :class:`RestoreError` naming it."""
        mid = entry.get("construction")
        if mid is None:
            raise RestoreError(
                f"{self.ref}: cannot rebuild submodule {path!r} ({entry['class']}): the module's structure was "
                f"changed after it was constructed and this piece has no construction record "
                f"({entry.get('missing', 'not recorded')}). Build the module yourself and load "
                "module.load_state_dict(cap.fresh_state_dict())")
        return self.construct(mid)

    def _put_back(self, module: torch.nn.Module, entry: TreeEntry, path: str, changed: list[str]) -> None:
        """Apply the recorded parametrizations and norm hooks that ``module`` does not have yet
        (its constructor may apply some itself, e.g. ``parametrizations.weight_norm`` in ``__init__``)."""
        from torch.nn.utils import parametrize

        for tensor_name, chain in entry.get("parametrizations", {}).items():
            have = len(_parametrization_list(module, tensor_name)) if parametrize.is_parametrized(module, tensor_name) else 0
            for position, piece in enumerate(chain["modules"]):
                if position < have:
                    continue
                parametrization = self._piece(piece, f"{path}.parametrizations.{tensor_name}.{position}")
                parametrize.register_parametrization(module, tensor_name, parametrization, unsafe=chain["unsafe"])
                changed.append(f"{path or '<root>'}.{tensor_name} parametrized")
        for hook in entry.get("reapply", []):
            if _has_norm_hook(module, hook):
                continue
            if hook["kind"] == "accelerate":
                self._add_accelerate_hooks(module, hook)
                changed.append(f"{path or '<root>'}: accelerate hooks")
                continue
            if hook["kind"] == "hook":
                self._register_again(module, hook)
                changed.append(f"{path or '<root>'}: {hook['on'].replace('_', '-')} hook {hook['hook']}")
                continue
            if hook["kind"] == "prune":
                # the recorded mask and original come with the state; any pruning method's forward is
                # weight = weight_orig * weight_mask, so torch's identity pruning rebuilds it
                from torch.nn.utils import prune

                prune.identity(module, hook["name"])
                changed.append(f"{path or '<root>'}.{hook['name']} pruned (its recorded mask)")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the hook-based norms
                if hook["kind"] == "weight_norm":
                    torch.nn.utils.weight_norm(module, name=hook["name"], dim=hook["dim"])
                elif hook["kind"] == "spectral_norm":
                    torch.nn.utils.spectral_norm(module, name=hook["name"], dim=hook["dim"], eps=hook["eps"],
                                                 n_power_iterations=hook["n_power_iterations"])
            changed.append(f"{path or '<root>'}.{hook['name']} {hook['kind']}")

    def _add_accelerate_hooks(self, module: torch.nn.Module, recorded: dict[str, Any]) -> None:
        """The accelerate ``ModelHook``s the job attached with ``add_hook_to_module`` (stored by
        their class and attributes, format/accelerate_codecs.py), attached again the same way."""
        hooks = decode_value(recorded["hooks"], self.decode_context())
        add_hook = self.resolver.resolve("accelerate.hooks:add_hook_to_module", "value")
        for hook in hooks if isinstance(hooks, list) else []:
            add_hook(module, hook, append=True)

    def _register_again(self, module: torch.nn.Module, hook: dict[str, Any]) -> None:
        """Register a hook a tool added after construction (``module_state.REREGISTERED_HOOKS``:
        only those, by import path, under the capture's import rules), first, as the tool did."""
        if REREGISTERED_HOOKS.get(hook["hook"]) != hook["on"]:
            raise CorruptCaptureError(f"{self.ref}: the capture asks to register {hook['hook']!r} as a "
                                      f"{hook['on']} hook, which modulelens never registers from a capture")
        function = self.resolver.resolve(hook["hook"], "value")
        if hook["on"] == "forward":
            module.register_forward_hook(function, prepend=True)
        else:
            module.register_forward_pre_hook(function, prepend=True)

    def _restore_attributes(self, module: torch.nn.Module) -> None:
        """Set the plain attributes recorded at capture (``module.attributes``) that a rebuild from
        the recorded arguments gives other values: state that methods set after construction
        (issue 11). With ``init_overrides``, those are told from a second, meta-device rebuild
        with the recorded arguments, so an overridden argument is not set back."""
        recorded = self.metadata["module"].get("attributes", {})
        if not recorded:
            return
        baseline = module
        construction = self.metadata["module"].get("construction")
        if self.options.init_overrides and construction is not None:
            with empty_weights(), random_state_kept():
                baseline = self.construct(construction)
        ctx = self.decode_context()
        changed = []
        for path, values in recorded.items():
            try:
                owner, reference = ((module.get_submodule(path), baseline.get_submodule(path)) if path
                                    else (module, baseline))
            except AttributeError:
                self.notes.append(f"submodule {path} of the capture is not in the rebuilt module; its attributes "
                                  "were not restored")
                continue
            for name, encoded in values.items():
                value = decode_value(encoded, ctx)
                if name not in vars(reference) or not _same_attribute(vars(reference)[name], value):
                    setattr(owner, name, value)
                    changed.append(f"{path}.{name}" if path else name)
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            self.notes.append(f"attributes set after construction restored as recorded: {shown}")

    # ------------------------------------------------------------------------------ states

    def assign_state(self, module: torch.nn.Module, index: int, *, live: bool) -> None:
        """Give ``module`` the parameters and buffers of recorded state ``index``: new mappings
        (``live=False``, a module being built), or copied into the tensors it has (``live=True``:
        the capture's module, whose parameters the user may hold)."""
        states = self.metadata.get("states", [])
        if not states:
            return
        state = states[index]
        if not live and self._builds_graphs:
            _graph_module_parameters(module, state)
        expected_params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
        expected_buffers = {n for n, b in module.named_buffers(remove_duplicate=False)}
        recorded_params = set(state["parameters"])
        recorded_buffers = set(state["buffers"]) | set(state.get("rebuilt_buffers", {}))  # the latter: the constructor's
        if expected_params != recorded_params or not recorded_buffers <= expected_buffers | _none_buffers(module):
            missing = sorted((expected_params - recorded_params) | (expected_buffers - recorded_buffers - _none_buffers(module)))
            unexpected = sorted((recorded_params - expected_params) | (recorded_buffers - expected_buffers - _none_buffers(module)))
            if missing or unexpected:
                raise RestoreError(self._mismatch_message(module, missing, unexpected))
        parameters: dict[str, torch.nn.Parameter] = {}
        for name, entry in state["parameters"].items():
            owner, leaf = _owner(module, name)
            if live:  # the registered parameter itself: get_parameter() reads it with getattr, which a
                # property of the same name shadows (tltorch's ComplexDenseTensor: neuralop's SpectralConv)
                with torch.no_grad():
                    cast(torch.nn.Parameter, owner._parameters[leaf]).copy_(self.open_tensor(entry["tensor"]))
                continue
            param = parameters.get(entry["tensor"])
            if param is None:  # tied parameters share one recorded tensor -> one Parameter
                param = torch.nn.Parameter(self.open_tensor(entry["tensor"]), requires_grad=entry["requires_grad"])
                parameters[entry["tensor"]] = param
            owner._parameters[leaf] = param
        for name, buffer in state["buffers"].items():
            owner, leaf = _owner(module, name)
            recorded = self.open_tensor(buffer["tensor"])
            current = owner._buffers.get(leaf)
            if live and current is not None and current.shape == recorded.shape:
                current.copy_(recorded)
                continue
            owner._buffers[leaf] = _own_buffer(recorded)
            if not buffer["persistent"]:
                owner._non_persistent_buffers_set.add(leaf)
        ctx = self.decode_context()
        for name, value in state.get("extra_state", {}).items():
            owner, _ = _owner(module, name)
            if type(owner).set_extra_state is torch.nn.Module.set_extra_state:  # torch's own raises RuntimeError
                raise RestoreError(f"{self.ref}: the capture has extra state for {name}, but the rebuilt "
                                   f"{type(owner).__name__} keeps none (has its code changed?)")
            owner.set_extra_state(decode_value(value, ctx))
        for path, values in state.get("module_state", {}).items():
            owner = _owner(module, f"{path}.x" if path else "x")[0]
            errors: list[str] = []
            metric = own_metric_states(owner)  # added into in place: copies, or a replay changes the recorded ones
            owner._load_from_state_dict({key: own_copy(decode_value(v, ctx)) if key in metric else decode_value(v, ctx)
                                         for key, v in values.items()}, "",
                                        {"version": getattr(type(owner), "_version", None)}, False, [], [], errors)
            if errors:
                raise RestoreError(f"{self.ref}: the recorded state of {path or '<root>'} does not load into the "
                                   f"rebuilt {type(owner).__name__}: {errors[0]}")
            if isinstance(getattr(owner, "_defaults", None), dict) and hasattr(owner, "_computed"):
                vars(owner)["_computed"] = None  # a torchmetrics Metric caches compute() until its next update: not this state's
        self.current_state = (index, state_versions(module))

    def _mismatch_message(self, module: torch.nn.Module, missing: list[str], unexpected: list[str]) -> str:
        """Why the rebuilt module's parameters differ from the recorded ones: its structure was
        changed after construction (re-parameterisation, fusing), or its code changed."""
        head = (f"{self.ref}: the rebuilt {type(module).__name__} does not match the captured state "
                f"(missing: {missing[:5]}, unexpected: {unexpected[:5]})")
        recorded = self.metadata["module"].get("structure")
        code_changed = any("changed since it was captured" in note for note in self.notes)
        difference = structure_difference(recorded, structure(module)) if isinstance(recorded, dict) else ""
        if code_changed or not difference:
            return f"{head}; has its code changed?"
        return (f"{head}: the module's structure was changed after it was constructed (re-parameterisation, "
                f"fusing...; {difference}), and its constructor arguments rebuild the original structure. "
                "Capture it before the change, rebuild that structure with load(..., init_overrides={...}) if "
                "its constructor can, or rebuild it yourself and load module.load_state_dict(cap.fresh_state_dict())")


def override_arguments(cls: type, args: tuple[object, ...], kwargs: Mapping[str, object], overrides: Mapping[str, object],
                       ref: str) -> tuple[tuple[object, ...], dict[str, object]]:
    """``(args, kwargs)`` with the arguments named in ``overrides`` replaced (a positional one in
    place, by its parameter name); a name the constructor does not take is a :class:`UsageError`."""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters) or not parameters
    new_args, new_kwargs = list(args), dict(kwargs)
    for name, value in overrides.items():
        if name in positional[:len(new_args)]:
            new_args[positional.index(name)] = value
        elif takes_any or any(p.name == name for p in parameters):
            new_kwargs[name] = value
        else:
            raise UsageError(f"{ref}: init_overrides names {name!r}, which {cls.__qualname__}() does not take "
                             f"(its parameters: {', '.join(p.name for p in parameters)})")
    return tuple(new_args), new_kwargs


class _NeedsRealConstructionError(Exception):
    pass


def state_versions(module: torch.nn.Module) -> tuple[int, ...]:
    """Identity and version counter of every parameter, buffer and torchmetrics metric state (without
    them a replayed ``update`` left its sums for the next call of the same state): changes on any write."""
    return (*(v for t in (*module.parameters(), *module.buffers()) for v in (id(t), t._version)),
            *metric_versions(module))


def _own_buffer(tensor: torch.Tensor) -> torch.Tensor:
    """A recorded buffer as a module can treat its own: not a view (``_open_tensor`` maps payloads
    as views of their file or pack, and quantization observers call ``self.histogram.detach_()``,
    which a view refuses: "Can't detach views in-place"), and, with at most one element, a copy
    that can grow (a mapped storage cannot; observers' per-channel ``min_val`` starts empty and a
    fake-quantize ``scale`` with one element, both resized to the number of channels at their
    first call). Larger buffers keep the mapped storage (copying every one cost loads time)."""
    if tensor.numel() <= 1:
        return tensor.clone()
    if tensor._base is None:
        return tensor
    own = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return own.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())


def _owner(module: torch.nn.Module, dotted: str) -> tuple[torch.nn.Module, str]:
    prefix, _, leaf = dotted.rpartition(".")
    try:
        return (module.get_submodule(prefix) if prefix else module), leaf
    except AttributeError:
        raise RestoreError(f"the capture names {dotted!r}, but the rebuilt {type(module).__name__} has no "
                           f"submodule {prefix!r}") from None


def _keep_traced_modes(module: torch.nn.Module, modes: dict[str, bool]) -> None:
    """A module ``torch.jit.trace`` made ran the graph traced in one mode whatever ``.train()`` set
    (a BatchNorm traced in eval mode normalises with its running statistics in train mode too), so
    its eager rebuild is put in that mode and keeps it: ``train()`` on it (or on a parent) leaves it
    as it is, like the traced module."""
    for path, training in modes.items():
        try:
            sub = module.get_submodule(path) if path else module
        except AttributeError:
            continue
        torch.nn.Module.train(sub, training)
        sub.train = _KeptMode(sub)  # type: ignore[method-assign, assignment]  # an instance's own train(), as the trace had


class _KeptMode:
    """``train`` of a module rebuilt from a traced one: its mode stays (see :func:`_keep_traced_modes`)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = weakref.ref(module)

    def __call__(self, mode: bool = True) -> torch.nn.Module | None:
        return self._module()


def _graph_module_parameters(module: torch.nn.Module, state: StateEntry) -> None:
    """A GraphModule rebuilt from its graph and a dict of what the graph uses
    (tracing/graph_modules.py) registers every tensor of the dict as a buffer (torch.fx's
    ``_assign_attr``); the recorded state says which were parameters, and they become parameters."""
    graphs = [path for path, sub in module.named_modules() if isinstance(sub, torch.fx.GraphModule)]
    if not graphs:
        return
    for name in state["parameters"]:
        if not any(path == "" or name.startswith(path + ".") for path in graphs):
            continue
        prefix, _, leaf = name.rpartition(".")
        try:
            owner = module.get_submodule(prefix) if prefix else module
        except AttributeError:
            continue
        buffer = owner._buffers.get(leaf)
        if buffer is not None and leaf not in owner._parameters:
            del owner._buffers[leaf]
            owner._non_persistent_buffers_set.discard(leaf)
            owner._parameters[leaf] = torch.nn.Parameter(buffer, requires_grad=buffer.is_floating_point())


def _none_buffers(module: torch.nn.Module) -> set[str]:
    return {f"{p}.{n}" if p else n for p, m in module.named_modules() for n, b in m._buffers.items() if b is None}


def _put(parent: torch.nn.Module, name: str, child: torch.nn.Module) -> None:
    """``child`` as ``parent``'s child ``name``, through ``nn.Module.__setattr__``: it also drops a
    plain attribute of that name (timm's MobileOne blocks hold ``reparam_conv = None`` until fused)."""
    setattr(parent, name, child)


def _class_path(module: torch.nn.Module) -> str:
    """The ``module:QualName`` of the class ``module``'s construction built (a parametrized module's
    generated class unwrapped), as the tracer records it."""
    cls = _constructed_type(module)
    return f"{cls.__module__}:{cls.__qualname__}"


def _constructed_type(module: torch.nn.Module) -> type:
    """The class ``module`` was built as: a parametrized module's generated class unwrapped, and
    the ``GraphModuleImpl`` fx generates for every GraphModule (a subclass defined in its ``__new__``)."""
    cls = type(module)
    if cls.__module__ == "torch.nn.utils.parametrize" and len(cls.__bases__) == 1:
        cls = cls.__bases__[0]
    if "<locals>" in cls.__qualname__ and isinstance(module, torch.fx.GraphModule) and len(cls.__bases__) == 1:
        cls = cls.__bases__[0]
    return cls


def _parametrization_list(module: torch.nn.Module, tensor_name: str) -> torch.nn.ModuleList:
    """The chain torch.nn.utils.parametrize keeps for ``tensor_name`` (a ModuleList in a ModuleDict)."""
    return cast(torch.nn.ModuleList, cast(torch.nn.ModuleDict, module.parametrizations)[tensor_name])


def _direct_state(state: StateEntry) -> dict[str, dict[str, str]]:
    """Recorded parameters and buffers by the path of the module that holds them: ``{path: {name: tensor id}}``."""
    found: dict[str, dict[str, str]] = {}
    for entries in (state["parameters"], state["buffers"]):
        for dotted, entry in entries.items():
            path, _, name = dotted.rpartition(".")
            found.setdefault(path, {})[name] = entry["tensor"]
    return found


def _same_direct_state(module: torch.nn.Module, recorded: dict[str, str], metadata: CaptureMetadata) -> bool:
    """Whether ``module`` holds exactly the recorded parameters and buffers of its own (names and
    shapes): a child of the right class built with other arguments than the job's does not."""
    own = {**{n: p for n, p in module._parameters.items() if p is not None},
           **{n: b for n, b in module._buffers.items() if b is not None}}
    if set(own) != set(recorded) - {n for n, b in module._buffers.items() if b is None}:
        return False
    tensors = metadata["tensors"]
    # an uninitialised (lazy) parameter takes the recorded one's shape when the state is assigned
    # (torch_geometric's Linear(-1, n) infers its input size at its first call, which the job made)
    return all(isinstance(tensor, UninitializedTensorMixin) or list(tensor.shape) == tensors[recorded[name]]["shape"]
               for name, tensor in own.items())


def _has_norm_hook(module: torch.nn.Module, hook: dict[str, Any]) -> bool:
    """Whether ``module`` has the recorded weight-deriving hook already (its constructor applied it)."""
    from torch.nn.utils.prune import BasePruningMethod
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    if hook["kind"] == "accelerate":
        return "_hf_hook" in vars(module)
    if hook["kind"] == "hook":
        table = module._forward_hooks if hook["on"] == "forward" else module._forward_pre_hooks
        return any(f"{getattr(h, '__module__', '')}:{getattr(h, '__qualname__', '')}" == hook["hook"]
                   for h in table.values())
    if hook["kind"] == "prune":
        return any(isinstance(h, BasePruningMethod) and h._tensor_name == hook["name"]
                   for h in module._forward_pre_hooks.values())
    kind = WeightNorm if hook["kind"] == "weight_norm" else SpectralNorm
    return any(isinstance(h, kind) and h.name == hook["name"] for h in module._forward_pre_hooks.values())


def _refresh_norm_weights(module: torch.nn.Module) -> None:
    """The weight that ``weight_norm``/``spectral_norm``/``prune`` keep as a plain attribute,
    computed from the loaded parameters (it was computed from meta tensors when the hook was
    applied; forward computes it again anyway). Spectral norm's power iteration is not run: its
    vectors are loaded."""
    from torch.nn.utils.prune import BasePruningMethod
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    for sub in module.modules():
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm):
                setattr(sub, hook.name, hook.compute_weight(sub))
            elif isinstance(hook, SpectralNorm):
                with torch.no_grad():
                    setattr(sub, hook.name, hook.compute_weight(sub, do_power_iteration=False))
            elif isinstance(hook, BasePruningMethod):
                setattr(sub, hook._tensor_name, hook.apply_mask(sub))


def _has_meta_tensors(module: torch.nn.Module) -> bool:
    """A meta tensor left anywhere in ``module``'s parameters, buffers or attributes. On the path to
    a runnable module, so torch's own bookkeeping attributes (hook tables, flags) are skipped by
    name: walking them cost a 1 GiB load 0.1 ms (isinstance against torch.Tensor runs Python)."""
    for sub in module.modules():
        for tensor in (*sub._parameters.values(), *sub._buffers.values()):
            if tensor is not None and tensor.is_meta:
                return True
        for name, value in vars(sub).items():
            if name not in _MODULE_BOOKKEEPING and _holds_meta_tensor(value):
                return True
    return False


# what torch.nn.Module.__init__ sets on every module: the tables of parameters, buffers and
# submodules (checked above, or modules of their own) and hooks and flags, which hold no tensors
_MODULE_BOOKKEEPING = frozenset(vars(torch.nn.Module()))


def _holds_meta_tensor(value: object, depth: int = 0) -> bool:
    """A meta tensor in ``value`` or in the lists, tuples and dicts it holds: peft's prompt and
    prefix tuning keep ``prompt_tokens = {adapter: arange(...)}``, which a meta-device construction
    leaves without data (replay then failed with "Cannot copy out of meta tensor", found by the census)."""
    if isinstance(value, torch.Tensor):
        return value.is_meta
    if depth < 4 and (type(value) is list or type(value) is tuple):
        return any(_holds_meta_tensor(item, depth + 1) for item in value)
    if depth < 4 and type(value) is dict:
        return any(_holds_meta_tensor(item, depth + 1) for item in value.values())
    return False


def _same_attribute(built: object, recorded: object) -> bool:
    """Whether a rebuilt module's attribute already is the recorded value (two partials are equal
    when they wrap the same function with equal arguments; ``==`` compares them by identity)."""
    if isinstance(built, functools.partial) and isinstance(recorded, functools.partial):
        return (built.func is recorded.func and built.args == recorded.args
                and built.keywords == recorded.keywords)
    return bool(built == recorded)


def _built_on_cpu(why: str) -> str:
    """The load note of a module that could not be built with empty (meta) weights: what it costs."""
    return (f"constructed with real weights on the CPU, then given the recorded ones ({why}): the load is "
            "slower than with empty weights, the module the same")

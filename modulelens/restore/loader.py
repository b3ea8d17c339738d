"""``modulelens.load``: a capture back as a module, its recorded calls, and replay.

:class:`Capture` reads the metadata and hands out recorded tensors as memory-mapped, copy-on-write
views of the payload blobs; the module itself is rebuilt by :mod:`modulelens.restore.rebuild`, each
recorded call is a :class:`~modulelens.restore.calls.Call`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from modulelens.errors import RestoreError, SourceChangedWarning
from modulelens.format.dtypes import QUANTIZED_STORAGE
from modulelens.format.layouts import is_plain, rebuild_subclass
from modulelens.format.shape_only import ShapeOnly
from modulelens.format.spec import FORMAT_VERSION, CaptureMetadata, TensorEntry
from modulelens.format.tensors import at_address_offset, contiguous_strides, dtype_from_name, layout_digest, quantized
from modulelens.format.values import DecodeContext, decode_value
from modulelens.repo import Repo
from modulelens.repo.trust import TrustPolicy
from modulelens.restore.calls import Call
from modulelens.restore.classes import ClassResolver
from modulelens.restore.rebuild import Rebuilder, RebuildOptions, state_versions
from modulelens.restore.synthesize import synthesize as synthesize_tensor

if TYPE_CHECKING:
    from modulelens.restore.replay import ReplayReport


class Capture:
    """A stored capture: metadata, the rebuilt module, recorded calls and replay.

    Example::

        cap = modulelens.load("ranker/mlp:v2")
        out = cap.module(*cap.calls[0].args, **cap.calls[0].kwargs)
        report = cap.replay()
        assert report.passed, report
    """

    def __init__(
        self,
        repo: Repo,
        name: str,
        version: int,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        init_args: Sequence[Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
        verify: bool = False,
        synthesize: bool = False,
        trust: TrustPolicy | None = None,
        init_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.repo = repo
        self.name = name
        self.version = version
        self.metadata = cast(CaptureMetadata, repo.read_metadata(name, version))
        self._payloads = repo.payloads(cast(dict[str, Any], self.metadata))
        if self.metadata.get("format_version", 0) > FORMAT_VERSION:
            raise RestoreError(
                f"{self.ref} uses capture format {self.metadata['format_version']}; "
                f"this modulelens reads up to {FORMAT_VERSION} (upgrade modulelens)"
            )
        self._read_ahead_weights()  # the disk reads while the classes are resolved and the calls listed
        self.device = torch.device(device) if device is not None else None
        self.dtype = dtype
        self._tensors: dict[str, torch.Tensor] = {}
        self._templates: dict[str, torch.Tensor] = {}  # opened once, copied for call.args (see _fresh_copy)
        self._handed_once: set[str] = set()  # pack members handed out as the pack's own view (_fresh_copy)
        # id -> (weak reference, tensor id) of the copies handed out by call.args/kwargs (payload_of)
        self._handed_out: dict[int, tuple[weakref.ref[torch.Tensor], str]] = _PrunedById()
        self._module: torch.nn.Module | None = None
        self.notes: list[str] = []
        self.synthesize = synthesize
        self._synthetic: dict[str, torch.Tensor] = {}
        trust = repo.trust_policy() if trust is None else trust  # load() resolves it; else the repo's own
        self._sources = ClassResolver(self.metadata.get("sources", {}), self.ref, trust=trust, forbidden=[repo.root],
                                      read_text=self._read_text,
                                      provenance=functools.partial(trust.provenance, name, version, self.metadata))
        self._rebuilder = Rebuilder(
            self.ref, self.metadata, self._sources, self._open_tensor, self._decode_context, self.notes,
            RebuildOptions(init_args=tuple(init_args) if init_args is not None else None,
                           init_kwargs=dict(init_kwargs or {}), init_overrides=dict(init_overrides or {}),
                           device=self.device, dtype=dtype))
        for message in self._sources.source_changes():
            warnings.warn(f"modulelens: {self.ref}: {message}", SourceChangedWarning, stacklevel=3)
        self._collect_source_notes()
        if verify:
            for entry in self.metadata["tensors"].values():
                if "payload" in entry:
                    self._payloads.check(cast(dict[str, Any], entry), full=True)
        self.calls = [
            Call(index=c["index"], training=c["training"], grad_enabled=c["grad_enabled"], state_index=c["state"],
                 finished=c.get("finished", True), autocast=c.get("autocast", {}), _capture=self, _data=c)
            for c in self.metadata["calls"]
        ]

    # ---------------------------------------------------------------------------------- info

    @property
    def trust_source(self) -> bool:
        """Whether the source stored with this capture may run (``load(..., trust_source=...)``)."""
        return self._sources.trust_source

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    @property
    def module_class(self) -> str:
        return self.metadata["module"]["class"]

    @property
    def method(self) -> str | None:
        """The method the recorded calls went through (``"encode"`` for a target ``vae:encode``,
        docs/fidelity.md "Method entry points"), or ``None`` when they were calls ``module(...)``."""
        return self.metadata["module"].get("method")

    def entry_point(self, module: torch.nn.Module | None = None) -> Callable[..., Any]:
        """What the recorded calls called: ``module.<method>`` for a method capture, else
        ``module`` itself (default: :attr:`module`). Replay, verify, diff and profile run it.

        Raises:
            RestoreError: the module has no such method (a candidate of another class).

        Example::

            call = cap.calls[0]
            with call.context():
                out = cap.entry_point()(*call.args, **call.kwargs)   # vae.encode(...) for "sd/vae.encode"
        """
        target = self.module if module is None else module
        method = self.method
        if method is None:
            return target
        found = getattr(target, method, None)
        if not callable(found):
            raise RestoreError(f"{self.ref} recorded calls of {method}(), which {type(target).__qualname__} does not have")
        return cast("Callable[..., Any]", found)

    @property
    def environment(self) -> dict[str, Any]:
        return self.metadata.get("environment", {})

    @property
    def module_type(self) -> type[torch.nn.Module]:
        """The captured module's class, resolved as :attr:`module` resolves it, under the capture's
        trust rules (docs/security.md): an import, else (trusted) the source stored with it.
        Nothing is constructed.

        Raises:
            UntrustedCodeError: the path is refused, or only stored source has it and it is not trusted.
            RestoreError: the class cannot be imported and the capture holds no usable source for it.

        Example::

            cls = cap.module_type          # e.g. <class 'model.TopMLP'>
        """
        return self._rebuilder.module_type()

    @property
    def init_arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The constructor arguments :attr:`module` is built with, ``(args, kwargs)``: those given to
        ``load(..., init_args=, init_kwargs=)``, else the recorded ones, decoded (tensors
        memory-mapped, nested modules rebuilt) with ``load(..., init_overrides=)`` applied;
        ``None`` when there are neither.

        Raises:
            RestoreError: a recorded argument cannot be decoded here.
            UsageError: ``init_overrides`` names an argument the constructor does not take.

        Example::

            args, kwargs = cap.init_arguments   # ((64, 128), {"bias": True})
        """
        return self._rebuilder.init_arguments()

    def stored_source(self, module_name: str) -> str | None:
        """The source text of ``module_name`` stored with the capture (see
        :mod:`modulelens.restore.source`), or ``None`` when none was stored.

        Example::

            text = cap.stored_source("__main__")
        """
        return self._sources.text(module_name)

    def _read_text(self, tid: str) -> str:
        """A stored source file (a blob referenced from ``sources``, docs/format.md)."""
        if self.metadata["tensors"][tid]["nbytes"] == 0:
            return ""
        return self.fresh_tensor(tid).numpy().tobytes().decode("utf-8")

    def payload_of(self, tensor: torch.Tensor) -> str | None:
        """The payload hash of a tensor this capture returned (from :meth:`tensor`, a call's inputs or
        outputs, a state), found by identity; ``None`` for any other tensor.

        Example::

            cap.payload_of(cap.calls[0].args[0])   # "blake3:..."
        """
        for tid, known in self._tensors.items():
            if known is tensor:
                return self.metadata["tensors"][tid].get("payload")
        handed = self._handed_out.get(id(tensor))  # a copy from call.args/kwargs/inputs
        if handed is not None and handed[0]() is tensor:
            return self.metadata["tensors"][handed[1]].get("payload")
        return None

    def __repr__(self) -> str:
        entry = self.module_class.rsplit(':', 1)[-1] + (f".{self.method}" if self.method else "")
        return (f"<Capture {self.ref} {entry}: {len(self.calls)} call(s), "
                f"{len(self.metadata.get('states', []))} state(s)>")

    # ---------------------------------------------------------------------------------- tensors

    def tensor(self, tid: str) -> torch.Tensor:
        """A recorded tensor, memory-mapped, as it was captured (no device/dtype override).
        A shape-only tensor raises :class:`RestoreError` unless ``load(..., synthesize=True)``."""
        cached = self._tensors.get(tid)
        if cached is None:
            entry = self.metadata["tensors"][tid]
            if "view_of" in entry:  # views of one stored storage span share that storage here too
                cached = self.tensor(entry["view_of"]).as_strided(entry["shape"], entry["stride"],
                                                                  entry["storage_offset"])
            elif entry.get("shape_only"):
                cached = self._shape_only_tensor(tid, synthesize=True, strict=True)
            else:
                cached = self._open_tensor(tid)
            self._tensors[tid] = cached
        return cached

    def _open_tensor(self, tid: str) -> torch.Tensor:
        """A new copy-on-write mapping of a recorded tensor: the module's parameters get their own,
        so running or training the module never changes what `tensor()` returns."""
        entry = self.metadata["tensors"][tid]
        if entry.get("shape_only"):
            return self._shape_only_tensor(tid, synthesize=True, strict=True).clone()
        if "view_of" in entry:
            return self._open_tensor(entry["view_of"]).as_strided(entry["shape"], entry["stride"],
                                                                  entry["storage_offset"])
        if "subclass" in entry:  # a tensor subclass made of inner tensors (format/layouts.py)
            return self._subclass_tensor(entry)
        if "quantized" in entry:  # the payload is the integer representation
            values = self._payloads.open_tensor(cast(dict[str, Any], entry),
                                                dtype_from_name(QUANTIZED_STORAGE[entry["dtype"]]))
            return quantized(values.reshape(entry["shape"]), entry["quantized"], self._open_tensor)
        dtype = dtype_from_name(entry["dtype"])
        flat = self._payloads.open_tensor(cast(dict[str, Any], entry), dtype)
        stride = entry.get("stride")
        if stride is not None and entry["shape"] and stride != contiguous_strides(entry["shape"]) and flat.numel() > 1:
            try:
                strided = torch.empty_strided(entry["shape"], stride, dtype=dtype)
                strided.copy_(flat)
                flat = strided
            except RuntimeError:
                pass  # an overlapping layout cannot be rebuilt; the contiguous tensor is equal in value
        # where the job's tensor started past a 64-byte boundary (0 unless recorded): a blob's map
        # starts on one, a pack member anywhere; kernels round by it (format/tensors.py)
        return at_address_offset(flat, entry.get("address_offset", 0))

    def _subclass_tensor(self, entry: TensorEntry) -> torch.Tensor:
        """A tensor subclass (torchao's quantized weights) from its recorded parts and context, by its
        class's own ``__tensor_unflatten__``; the class is resolved under the capture's import rules."""
        data = entry["subclass"]
        cls = self._sources.resolve(data["class"], "class")
        context = decode_value(data["context"], self._decode_context())
        parts = {name: self._open_tensor(tid) for name, tid in data["parts"].items()}
        return rebuild_subclass(cls, parts, context, entry["shape"], entry["stride"])

    def _fresh_copy(self, tid: str) -> torch.Tensor:
        """A new copy of recorded tensor ``tid`` that nothing else holds, for ``call.args``.

        Opening a payload through the repo checks it (a sampled hash of a blob over 1 MiB, a full
        one below) and maps it; doing that on every access made reading ``call.args`` cost more
        than most modules' forward (benchmarks/bench_call_inputs.py). So a payload up to
        ``_COPY_MAX_BYTES`` is opened once, as a template nothing else sees, and each access copies
        it; a larger one is opened anew, a copy-on-write mapping that reads nothing until used
        (copying it would read it all). A pack member's first hand-out is the pack's own
        copy-on-write view of it (packs.py: nothing else gets that view), so the first access
        copies nothing; the template is made on the second (a load that reads each call once
        spent a quarter of its time making templates and copying them once)."""
        entry = self.metadata["tensors"][tid]
        if "quantized" in entry or entry.get("shape_only") or entry.get("nbytes", 0) > _COPY_MAX_BYTES:
            return self._open_tensor(tid)
        template = self._templates.get(tid)
        if template is None:
            if "pack" in entry and tid not in self._handed_once:
                self._handed_once.add(tid)
                return self._open_tensor(tid)
            template = self._templates[tid] = self._open_tensor(tid)
        return at_address_offset(template.clone(memory_format=torch.preserve_format), entry.get("address_offset", 0))

    def _shape_only_tensor(self, tid: str, *, synthesize: bool, strict: bool = False) -> Any:
        entry = self.metadata["tensors"][tid]
        if synthesize and self.synthesize:
            if tid not in self._synthetic:
                self._synthetic[tid] = synthesize_tensor(entry, f"{self.ref}/{tid}")
            return self._synthetic[tid]
        marker = ShapeOnly(dtype_from_name(entry["dtype"]), tuple(entry["shape"]), entry.get("stats", {}), tid)
        if strict:
            raise RestoreError(f"{self.ref}: tensor {tid} ({marker.describe()}) was stored shape-only, without "
                               "values; load(..., synthesize=True) builds a synthetic one from its statistics")
        return marker

    @functools.cached_property
    def _grad_tids(self) -> frozenset[str]:
        """Tensors recorded as call values that required grad in the job (docs/format.md)."""
        return frozenset(tid for tid, entry in self.metadata["tensors"].items() if entry.get("requires_grad"))

    def _decode_context(self, synthesize: bool = False, fresh: bool = False) -> DecodeContext:
        """Decoding with the capture's cached tensors, or (``fresh``) with new copy-on-write
        mappings, one per tensor id for this decoding (views of one storage stay views of one)."""
        tensors = self.metadata["tensors"]
        opened: dict[str, Any] = {}

        def get_tensor(tid: str) -> Any:
            if tensors[tid].get("shape_only"):
                found = self._shape_only_tensor(tid, synthesize=synthesize)
                return found.clone() if fresh and isinstance(found, torch.Tensor) else found
            if not fresh:
                return self.tensor(tid)
            if tid not in opened:
                entry = tensors[tid]
                opened[tid] = (get_tensor(entry["view_of"]).as_strided(entry["shape"], entry["stride"],
                                                                      entry["storage_offset"])
                               if "view_of" in entry else self._fresh_copy(tid))
                self._handed_out[id(opened[tid])] = (weakref.ref(opened[tid]), tid)
            return opened[tid]

        return DecodeContext(get_tensor=get_tensor, get_module=self._rebuilder.construct, resolve=self._sources.resolve)

    @property
    def shape_only(self) -> list[str]:
        """Paths of the tensors this capture stored shape-only."""
        return list(self.metadata.get("shape_only", []))

    # ---------------------------------------------------------------------------------- module

    @property
    def module(self) -> torch.nn.Module:
        """The original class rebuilt from its recorded arguments, with the recorded weights, in
        the mode (train/eval) of its first recorded call, so ``module(*call.args, **call.kwargs)``
        computes what that call did. When the recorded calls differ in mode, :attr:`notes` says so
        (:meth:`replay` sets each call's own mode)."""
        if self._module is None:
            module = self._rebuilder.build()
            self._check_rebuilt_buffers(module)
            self._set_recorded_mode(module)
            self._module = module
        return self._module

    def _read_ahead_weights(self) -> None:
        """Let the disk read what the checks of state 0's payloads (what :meth:`module` opens, one
        by one) will read, all at once and from the start of a load: out of the page cache, a load
        of 16 weight files waited for 32 small reads in turn (repo/markers.py, ``read_ahead``)."""
        states = self.metadata.get("states") or []
        if not states:
            return
        tensors = self.metadata["tensors"]
        wanted = [entry["tensor"] for entry in states[0]["parameters"].values()]
        wanted += [entry["tensor"] for entry in states[0]["buffers"].values()]
        self._payloads.read_ahead(cast(dict[str, Any], tensors[tid]) for tid in wanted if tid in tensors)

    def _check_rebuilt_buffers(self, module: torch.nn.Module) -> None:
        """The non-persistent sparse or nested buffers the capture did not store (docs/fidelity.md)
        must be what the constructor built in the job, else replay would compute with other values."""
        for index, state in enumerate(self.metadata.get("states", [])):
            for name, entry in state.get("rebuilt_buffers", {}).items():
                try:
                    found = module.get_buffer(name)
                except AttributeError:
                    found = None
                if found is None or is_plain(found) or layout_digest(found) != entry["digest"]:
                    what = "has no such buffer" if found is None else "built another value"
                    raise RestoreError(f"{self.ref}: buffer {name} ({entry['layout']}, not persistent) was not stored: "
                                       f"the constructor rebuilds it, but the rebuilt {type(module).__name__} {what} "
                                       f"than in the job (state {index}); it was changed after construction")

    def _set_recorded_mode(self, module: torch.nn.Module) -> None:
        if not self.calls:
            return
        module.train(self.calls[0].training)
        if len({call.training for call in self.calls}) > 1:
            first = "training" if self.calls[0].training else "eval"
            self.notes.append(f"the recorded calls ran in both training and eval mode; the module is in {first} mode "
                              "(that of the first call): set module.train(call.training) per call, as replay() does")

    def _collect_source_notes(self) -> None:
        self._rebuilder.collect_source_notes()

    @contextlib.contextmanager
    def module_kept(self, module: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
        """On exit, ``module`` (default: :attr:`module`) holds the parameters and buffers it held on
        entry and each submodule has its training flag back, whatever the block did to them (a
        state switch, a training-mode forward updating running statistics, an edit).

        :attr:`module` holding a recorded state unchanged is reloaded from the capture when
        something changed (nothing is copied); any other module is copied once on entry.

        Example::

            with cap.module_kept():
                cap.use_state(3)
                out = cap.module(*cap.calls[5].args)
            # cap.module holds the weights it held before
        """
        target = self.module if module is None else module
        held = self._rebuilder.current_state
        versions = state_versions(target)
        reload = held[0] if target is self._module and held is not None and held[1] == versions else None
        copies = None if reload is not None else {name: tensor.detach().clone() for name, tensor in _state_items(target)}
        modes = [(sub, sub.training) for sub in target.modules()]
        try:
            yield target
        finally:
            for sub, training in modes:
                sub.training = training
            if state_versions(target) != versions:
                if reload is not None:
                    self.use_state(reload, force=True)
                elif copies is not None:
                    with torch.no_grad():
                        for name, tensor in _state_items(target):
                            if name in copies:
                                tensor.copy_(copies[name])

    @property
    def held_state(self) -> int | None:
        """The recorded state :attr:`module` holds unchanged (its index in the capture's states), or
        ``None`` when it holds other weights (an edit, a training step) or is not built yet."""
        held = self._rebuilder.current_state
        if self._module is None or held is None or held[1] != state_versions(self._module):
            return None
        return held[0]

    def use_state(self, index: int, *, force: bool = False) -> torch.nn.Module:
        """Load the parameters/buffers recorded for state ``index`` (calls name theirs), unless the
        module holds exactly them already (no other state loaded, nothing changed in place).
        ``force`` reloads regardless: writes through ``.data`` leave version counters unchanged."""
        module = self.module
        if force or self._rebuilder.current_state != (index, state_versions(module)):
            # no_grad: a buffer that is a view of a parameter (vector-quantize-pytorch's EMA codebook)
            # refused the in-place copy of a later state ("a view of a leaf Variable that requires grad")
            with torch.no_grad():
                self._rebuilder.assign_state(module, index, live=True)
        return module

    def state_dict(self, index: int = 0) -> dict[str, torch.Tensor]:
        """Parameters and persistent buffers of recorded state ``index`` (cached mappings, which the
        rebuilt module shares: see :meth:`fresh_state_dict` for copies nothing else touches)."""
        return self._state_tensors(index, self.tensor, persistent_only=True)

    def fresh_tensor(self, tid: str) -> torch.Tensor:
        """Recorded tensor ``tid`` from a new copy-on-write mapping of its payload, as recorded.

        :meth:`tensor` returns cached tensors that the rebuilt module also uses as its parameter and
        buffer storage, so switching states or a training-mode forward (BatchNorm running stats)
        changes them in place; tools read recorded values from here instead.
        """
        return self._open_tensor(tid)

    def fresh_state_dict(self, index: int = 0, *, persistent_only: bool = True) -> dict[str, torch.Tensor]:
        """Parameters and (persistent) buffers of recorded state ``index``, freshly mapped.

        Example::

            candidate.load_state_dict(cap.fresh_state_dict(cap.calls[3].state_index))
        """
        return self._state_tensors(index, self._open_tensor, persistent_only=persistent_only)

    def fresh_module_state(self, index: int = 0) -> dict[str, object]:
        """What recorded state ``index`` holds beyond parameters and buffers (torchmetrics' metric
        states, a dynamically quantized Linear's packed weights; docs/format.md, ``module_state``), by
        dotted name, freshly mapped.

        Example::

            cap.fresh_module_state(cap.calls[2].state_index)["total"]   # a metric's running count
        """
        ctx = self._decode_context(fresh=True)
        held = self.metadata["states"][index].get("module_state", {})
        return {f"{path}.{name}" if path else name: decode_value(value, ctx)
                for path, values in held.items() for name, value in values.items()}

    def _state_tensors(self, index: int, open_tensor: Callable[[str], torch.Tensor], *,
                       persistent_only: bool) -> dict[str, torch.Tensor]:
        state = self.metadata["states"][index]
        result = {n: open_tensor(e["tensor"]) for n, e in state["parameters"].items()}
        result.update({n: open_tensor(e["tensor"]) for n, e in state["buffers"].items()
                       if e["persistent"] or not persistent_only})
        return result

    # ---------------------------------------------------------------------------------- replay

    def replay(
        self,
        *,
        calls: Sequence[int] | None = None,
        exact: bool | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        module: torch.nn.Module | None = None,
        weights: str = "recorded",
        backward: bool = False,
        locate_divergence: bool = True,
        ulps: float | Mapping[str, float] | None = None,
    ) -> ReplayReport:
        """Run the module on every recorded call and compare with the recorded outputs; see
        :func:`modulelens.restore.replay.replay` for the arguments.

        Example::

            report = modulelens.load("ranker/mlp").replay()
            assert report.passed, report
        """
        from modulelens.restore.replay import replay

        return replay(self, calls=calls, exact=exact, rtol=rtol, atol=atol, module=module, weights=weights,
                      backward=backward, locate_divergence=locate_divergence, ulps=ulps)


# call.args copies a payload up to this size from one mapping opened once; a larger one gets a new
# copy-on-write mapping (see Capture._fresh_copy; the crossover measured in bench_call_inputs.py).
_COPY_MAX_BYTES = 1 << 20


class _PrunedById(dict[int, tuple[weakref.ref[torch.Tensor], str]]):
    """A dict of ``id -> (weak reference, value)`` that drops dead entries as it grows."""

    _limit = 1024

    def __setitem__(self, key: int, value: tuple[weakref.ref[torch.Tensor], str]) -> None:
        if len(self) >= self._limit:
            for dead in [k for k, (ref, _) in self.items() if ref() is None]:
                del self[dead]
            self._limit = max(1024, 2 * len(self))
        super().__setitem__(key, value)


def load(
    ref: str,
    *,
    repo: Repo | str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    init_args: Sequence[Any] | None = None,
    init_kwargs: dict[str, Any] | None = None,
    verify: bool = False,
    synthesize: bool = False,
    trust_source: bool | None = None,
    run_source: bool | None = None,
    init_overrides: dict[str, Any] | None = None,
) -> Capture:
    """Load ``"name[:vN|:alias]"`` from ``repo`` (default: ``$MODULELENS_REPO`` / the user repo).

    Loading runs no code from the capture unless you trust it (docs/security.md): every class and
    function the metadata names must be importable here and of an allowed kind, checked before
    anything is called.

    Args:
        ref: ``name``, ``name:v3`` or ``name:alias``; or ``wandb://ENTITY/PROJECT/COLLECTION:alias``,
            an artifact of the W&B Registry (needs ``modulelens[wandb]``), downloaded into the
            cache once and loaded from there (``repo`` is then not used).
        repo: a :class:`Repo` or its path.
        device: move the module and the inputs used by replay there.
        dtype: cast the module and the inputs used by replay.
        init_args: constructor arguments for a module captured without a constructor record.
        init_kwargs: constructor keyword arguments, likewise.
        verify: re-hash every payload (normally: size always, a sampled hash of large payloads,
            a full hash of payloads changed since their last check).
        synthesize: replace tensors stored shape-only by synthetic ones matching their recorded
            dtype, shape and statistics (otherwise using one raises :class:`RestoreError`).
        trust_source: run the source stored with the capture for classes that cannot be
            imported here (``None``: the repo's own setting, :attr:`Repo.trust_source`, which is
            off unless you set it). Without trust such a class raises :class:`UntrustedCodeError`,
            except in a capture you saved into this repo yourself (docs/security.md, "Your own captures").
        run_source: deprecated alias of ``trust_source``.
        init_overrides: replace single recorded constructor arguments by name
            (``{"drop_rate": 0.0}``); :attr:`Capture.init_arguments` shows the resulting ones.

    Returns:
        The :class:`Capture`; its module is built on first use of ``.module``, in the mode
        (train/eval) of the first recorded call, with plain attributes set after construction
        restored as recorded.

    Raises:
        CaptureNotFoundError: no such name, version or alias.
        CorruptCaptureError: the metadata is damaged or not a capture.
        UntrustedCodeError: the capture names something the trust rules refuse.
        RestoreError: the module cannot be rebuilt here (the message says why: a class that
            cannot be imported, a structure changed after construction...).
        UsageError: ``init_overrides`` names an argument the constructor does not take.
        MissingDependencyError, RemoteRepoError: a ``wandb://`` ref without the wandb SDK, or W&B
            cannot be reached.

    Example::

        cap = modulelens.load("demo/top_mlp:latest")
        print(cap.replay())
    """
    if run_source is not None:
        warnings.warn("load(..., run_source=...) is deprecated; use trust_source=...", DeprecationWarning,
                      stacklevel=2)
        trust_source = run_source if trust_source is None else trust_source
    if ref.startswith("wandb://"):  # a W&B Registry artifact: downloaded into the cache, loaded from there
        from modulelens.repo.wandb_registry import resolve_wandb_ref

        repo, ref = resolve_wandb_ref(ref)
    repo = repo if isinstance(repo, Repo) else Repo(repo, create=False)
    name, version = repo.resolve(ref)
    repo.fetch_version(name, version)  # a remote repo downloads the payloads into its cache, in parallel
    # Trust is decided here, once (repo/trust.py): trust_source=None is the repo's setting, which a
    # remote repo never takes from a file (off unless Repo(url, trust_source=True)).
    trust = repo.trust_policy(trust_source)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        return Capture(repo, name, version, device=device, dtype=dtype, init_args=init_args,
                       init_kwargs=init_kwargs, verify=verify, synthesize=synthesize, trust=trust,
                       init_overrides=init_overrides)


def _state_items(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``module`` by name, tied ones once."""
    yield from module.named_parameters()
    yield from module.named_buffers()

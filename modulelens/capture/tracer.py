"""The tracer: forward hooks on chosen submodules that record real calls, then get out of the way.

Per target it skips ``warmup`` calls, records ``max_calls`` calls (inputs as they were on entry,
outputs, grad mode, training flag, RNG state, and the parameters/buffers whenever they changed),
and removes every hook once all targets are done, so the rest of the job pays nothing.

The tracer fails open: an error inside a hook is reported as a warning, that target is dropped
and the job continues. ``strict=True`` raises instead.
"""

from __future__ import annotations

import fnmatch
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from modulelens.capture.environment import describe_environment
from modulelens.capture.init_tracking import get_init_record
from modulelens.capture.records import CallRecord, ModuleRecord, StateSnapshot
from modulelens.capture.snapshot import Snapshotter
from modulelens.errors import ModulelensError, UnsupportedValueError

_WRAPPER_ATTRS = ("module", "_orig_mod")  # DDP/DataParallel/FSDP1 and torch.compile wrappers


class CaptureWarning(UserWarning):
    """Something went wrong inside capture; the job was left running."""


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module under DDP / DataParallel / ``torch.compile`` wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        cls_name = type(model).__name__
        if cls_name in ("DistributedDataParallel", "DataParallel") and isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        elif cls_name == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            break
    return model


def normalise_name(name: str) -> str:
    """Drop wrapper segments (``module.``, ``_orig_mod.``) from a qualified module name."""
    parts = [p for p in name.split(".") if p not in ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
    return ".".join(parts)


def matches(pattern: str, qualified_name: str, module: torch.nn.Module) -> bool:
    """A target pattern matches a qualified-name glob, a class name, or a full class path."""
    cls = type(module)
    if pattern in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
        return True
    return bool(qualified_name) and fnmatch.fnmatchcase(qualified_name, pattern)


def find_targets(model: torch.nn.Module, patterns: Sequence[str]) -> dict[str, torch.nn.Module]:
    """Qualified name -> module for every submodule matching any pattern (wrappers unwrapped)."""
    found: dict[str, torch.nn.Module] = {}
    seen_ids: set[int] = set()
    for raw_name, module in unwrap_model(model).named_modules():
        name = normalise_name(raw_name)
        if id(module) in seen_ids:
            continue
        if any(matches(p, name, module) for p in patterns):
            found[name] = module
            seen_ids.add(id(module))
    return found


@dataclass
class _Pending:
    call: CallRecord


class Tracer:
    """Records calls of target submodules of ``model``; see :func:`modulelens.capture`."""

    def __init__(
        self,
        model: torch.nn.Module,
        targets: Sequence[str] | str,
        *,
        warmup: int = 0,
        max_calls: int = 1,
        on_complete: Callable[[Tracer], Any] | None = None,
        strict: bool = False,
        record_rng: bool = True,
    ) -> None:
        if isinstance(targets, str):
            targets = [targets]
        if not targets:
            raise ModulelensError("capture needs at least one target pattern")
        if warmup < 0 or max_calls < 1:
            raise ModulelensError("warmup must be >= 0 and max_calls >= 1")
        self.model = model
        self.patterns = list(targets)
        self.warmup = warmup
        self.max_calls = max_calls
        self.on_complete = on_complete
        self.strict = strict
        self.record_rng = record_rng
        self.records: dict[str, ModuleRecord] = {}
        self.environment = describe_environment()
        self._snap = Snapshotter()
        self._handles: dict[str, list[Any]] = {}
        self._stacks: dict[str, list[_Pending | None]] = {}
        self._state_keys: dict[str, tuple[tuple[int, int], ...]] = {}
        self._lock = threading.RLock()
        self.finished = False
        modules = find_targets(model, self.patterns)
        unmatched = [p for p in self.patterns if not any(matches(p, n, m) for n, m in modules.items())]
        if not modules:
            raise ModulelensError(f"no submodule matches the targets {self.patterns}")
        if unmatched:
            warnings.warn(f"modulelens: targets {unmatched} match no submodule", CaptureWarning, stacklevel=3)
        for name, module in modules.items():
            self._attach(name, module)

    # ------------------------------------------------------------------------------ hooks

    def _attach(self, name: str, module: torch.nn.Module) -> None:
        self.records[name] = ModuleRecord(
            qualified_name=name, module_class=type(module), construction=get_init_record(module), module=module
        )
        self._stacks[name] = []
        pre = module.register_forward_pre_hook(self._make_pre_hook(name), with_kwargs=True)
        post = module.register_forward_hook(self._make_post_hook(name), with_kwargs=True, always_call=True)
        self._handles[name] = [pre, post]

    def _make_pre_hook(self, name: str) -> Callable[..., None]:
        def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                self._on_enter(name, module, args, kwargs)
            except Exception as error:  # fail open
                self._fail(name, error)
        return pre_hook

    def _make_post_hook(self, name: str) -> Callable[..., None]:
        def post_hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            try:
                self._on_exit(name, output)
            except Exception as error:  # fail open
                self._fail(name, error)
        return post_hook

    def _on_enter(self, name: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self._lock:
            record = self.records[name]
            index = record.seen_calls
            record.seen_calls += 1
            if index < self.warmup or len(record.calls) >= self.max_calls or record.failed:
                self._stacks[name].append(None)
                return
            call = CallRecord(
                index=index,
                args=self._snap.tree(tuple(args)),
                kwargs=self._snap.tree(dict(kwargs)),
                state_index=self._state_index(name, module),
                training=module.training,
                grad_enabled=torch.is_grad_enabled(),
                autocast=_autocast_state(),
            )
            if self.record_rng:
                call.rng = _rng_state(args, kwargs)
            record.calls.append(call)
            self._stacks[name].append(_Pending(call))

    def _on_exit(self, name: str, output: Any) -> None:
        with self._lock:
            stack = self._stacks[name]
            pending = stack.pop() if stack else None
            if pending is None:
                return
            raised = sys.exc_info()[1]
            if output is None and raised is not None:
                # forward raised (this is the always_call path): drop the call, record a later one
                self.records[name].calls.remove(pending.call)
                return
            pending.call.output = self._snap.tree(output)
            pending.call.finished = True
            record = self.records[name]
            if len(record.calls) >= self.max_calls and all(c.finished for c in record.calls):
                record.complete = True
                self._detach(name)
            if not self._handles:
                self._finish()

    def _state_index(self, name: str, module: torch.nn.Module) -> int:
        """Snapshot parameters and buffers when they changed since the last recorded call
        (optimizer steps bump version counters), else reuse the last snapshot."""
        params = dict(module.named_parameters(remove_duplicate=False))
        buffers = dict(module.named_buffers(remove_duplicate=False))
        key = tuple((id(t), t._version) for t in (*params.values(), *buffers.values()))
        record = self.records[name]
        if record.states and self._state_keys.get(name) == key:
            return len(record.states) - 1
        non_persistent = _non_persistent_buffers(module)
        extra = {}
        for sub_name, sub in module.named_modules():
            if type(sub).get_extra_state is not torch.nn.Module.get_extra_state:
                extra[f"{sub_name}._extra_state" if sub_name else "_extra_state"] = sub.get_extra_state()
        record.states.append(StateSnapshot(
            parameters={n: self._snap.tensor(p) for n, p in params.items()},
            requires_grad={n: p.requires_grad for n, p in params.items()},
            buffers={n: self._snap.tensor(b) for n, b in buffers.items() if b is not None},
            persistent={n: n not in non_persistent for n in buffers},
            extra_state=extra,
        ))
        self._state_keys[name] = key
        return len(record.states) - 1

    def _detach(self, name: str) -> None:
        for handle in self._handles.pop(name, []):
            handle.remove()

    def _fail(self, name: str, error: Exception) -> None:
        if self.strict:
            raise error
        with self._lock:
            record = self.records.get(name)
            if record is not None:
                record.failed = f"{type(error).__name__}: {error}"
            self._detach(name)
            self._stacks[name] = []
        warnings.warn(f"modulelens: capture of {name or '<root>'} failed and was dropped: {error}", CaptureWarning, stacklevel=2)
        if not self._handles:
            self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self._snap.synchronize()
        self._snap.clear()
        if self.on_complete is not None:
            try:
                self.on_complete(self)
            except Exception as error:
                if self.strict:
                    raise
                warnings.warn(f"modulelens: on_complete callback failed: {error}", CaptureWarning, stacklevel=2)

    # ------------------------------------------------------------------------------ public

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.records.values())

    @property
    def active_hooks(self) -> int:
        return sum(len(h) for h in self._handles.values())

    def stop(self) -> None:
        """Remove every hook now (captured calls are kept)."""
        for name in list(self._handles):
            self._detach(name)
        self._snap.synchronize()
        self._snap.clear()

    def save(
        self,
        repo: Any = None,
        name: str | None = None,
        *,
        tags: Iterable[str] = (),
        metadata: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Save every target that recorded at least one call; returns their ``VersionInfo``s."""
        from modulelens.format.encode import encode_record
        from modulelens.repo.local import Repo

        self._snap.synchronize()
        repo = repo if isinstance(repo, Repo) else Repo(repo)
        prefix = name or type(unwrap_model(self.model)).__name__
        saved = []
        settings = {"targets": self.patterns, "warmup": self.warmup, "max_calls": self.max_calls}
        for qualified, record in self.records.items():
            if not record.calls:
                if record.failed:
                    continue
                warnings.warn(f"modulelens: {qualified or '<root>'} was never called after warm-up; nothing saved",
                              CaptureWarning, stacklevel=2)
                continue
            capture_name = f"{prefix}/{qualified}" if qualified else prefix
            try:
                meta, payloads = encode_record(record, environment=self.environment, settings=settings,
                                               tags=list(tags), metadata=metadata)
            except UnsupportedValueError as error:
                if self.strict:
                    raise
                warnings.warn(f"modulelens: {capture_name}: constructor not recorded: {error}", CaptureWarning, stacklevel=2)
                construction, record.construction = record.construction, None
                try:
                    meta, payloads = encode_record(record, environment=self.environment, settings=settings,
                                                   tags=list(tags), metadata=metadata)
                finally:
                    record.construction = construction
                meta["module"]["construction_missing"] = str(error)
            saved.append(repo.save_version(capture_name, meta, payloads))
        return saved


def _non_persistent_buffers(module: torch.nn.Module) -> set[str]:
    names = set()
    for prefix, sub in module.named_modules():
        for buffer_name in getattr(sub, "_non_persistent_buffers_set", ()):
            names.add(f"{prefix}.{buffer_name}" if prefix else buffer_name)
    return names


def _autocast_state() -> dict[str, Any]:
    state: dict[str, Any] = {}
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                state[device] = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        except (RuntimeError, TypeError, AttributeError):
            continue
    return state


def _rng_state(args: Any, kwargs: Any) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = {t.device for t in torch.utils._pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"}
        for device in devices:
            state[str(device)] = torch.cuda.get_rng_state(device)
    return state

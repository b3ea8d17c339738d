"""Forward hooks on TorchScript modules, which torch refuses to register.

``register_forward_pre_hook`` and ``register_forward_hook`` raise on a ``ScriptModule`` ("is not
supported on ScriptModules"), yet calling one from Python goes through ``nn.Module.__call__``,
which runs the hook tables like any module's. So a scripted or traced module can be a capture
target: the tracer's hooks are put into those tables the way the register methods would (a
``RemovableHandle`` over the same dicts, so ``handle.remove()`` works as usual). Every other
module uses torch's own methods.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.hooks import RemovableHandle


def forward_pre_hook(module: torch.nn.Module, hook: Callable[..., object], *, prepend: bool = False,
                     with_kwargs: bool = False) -> RemovableHandle:
    """``module.register_forward_pre_hook(hook, prepend=..., with_kwargs=...)``, TorchScript modules too."""
    if not isinstance(module, torch.jit.ScriptModule):
        return module.register_forward_pre_hook(hook, prepend=prepend, with_kwargs=with_kwargs)
    handle = RemovableHandle(module._forward_pre_hooks, extra_dict=module._forward_pre_hooks_with_kwargs)
    _insert(module._forward_pre_hooks, handle.id, hook, prepend)
    if with_kwargs:
        module._forward_pre_hooks_with_kwargs[handle.id] = True
    return handle


def forward_hook(module: torch.nn.Module, hook: Callable[..., object], *, prepend: bool = False,
                 with_kwargs: bool = False, always_call: bool = False) -> RemovableHandle:
    """``module.register_forward_hook(hook, ...)``, TorchScript modules too."""
    if not isinstance(module, torch.jit.ScriptModule):
        return module.register_forward_hook(hook, prepend=prepend, with_kwargs=with_kwargs, always_call=always_call)
    handle = RemovableHandle(module._forward_hooks, extra_dict=[module._forward_hooks_with_kwargs,
                                                                module._forward_hooks_always_called])
    _insert(module._forward_hooks, handle.id, hook, prepend)
    if with_kwargs:
        module._forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        module._forward_hooks_always_called[handle.id] = True
    return handle


def _insert(table: dict[int, Callable[..., object]], key: int, hook: Callable[..., object], prepend: bool) -> None:
    table[key] = hook
    if prepend:
        table.move_to_end(key, last=False)  # type: ignore[attr-defined]  # torch's stubs say dict: an OrderedDict

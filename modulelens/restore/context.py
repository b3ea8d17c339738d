"""The state a recorded call ran in, put back around a replay: grad mode, autocast, RNG (torch's,
numpy's and Python's).

:meth:`modulelens.Call.context` adds the call's weights and training flag; replay and the tools use
this one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from modulelens.format.host_rng import restore_host_states, set_host_states
from modulelens.format.library_settings import settings_applied

if TYPE_CHECKING:
    from modulelens.restore.calls import Call


@contextlib.contextmanager
def call_context(call: Call, device: torch.device) -> Iterator[None]:
    """Grad mode, autocast and RNG state as they were when the call was recorded."""
    rng = call.rng
    cuda_devices = [d for d in rng if d.startswith("cuda")] if device.type == "cuda" else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[torch.device(d).index or 0 for d in cuda_devices],
                                                  enabled=bool(rng)))
        if "cpu" in rng:
            torch.set_rng_state(rng["cpu"].clone())
        for name in cuda_devices:
            torch.cuda.set_rng_state(rng[name].clone(), torch.device(name))
        previous = set_host_states(rng)  # numpy's and Python's generators, as torch's: put back after
        stack.callback(restore_host_states, previous)
        stack.enter_context(torch.set_grad_enabled(call.grad_enabled))
        stack.enter_context(settings_applied(call.settings))  # gpytorch's, as recorded (format/library_settings.py)
        for device_type, dtype in call.autocast.items():
            if device_type == device.type:
                stack.enter_context(torch.autocast(device_type, dtype=getattr(torch, dtype)))
        yield

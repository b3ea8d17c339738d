"""Replay recorded calls on the rebuilt module and compare with the recorded outputs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from modulelens.restore.compare import LeafResult, compare

if TYPE_CHECKING:
    from modulelens.restore.loader import Call, Capture


@dataclass
class CallReplay:
    call: int  # position in capture.calls
    index: int  # the module's call number in the original job
    passed: bool
    leaves: list[LeafResult] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def worst(self) -> LeafResult | None:
        failing = [leaf for leaf in self.leaves if not leaf.passed]
        return failing[0] if failing else None

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.call, "index": self.index, "passed": self.passed, "error": self.error,
                "seconds": self.seconds, "leaves": [leaf.to_dict() for leaf in self.leaves]}


@dataclass
class ReplayReport:
    ref: str
    mode: str  # "bit-exact" or "tolerance"
    device: str
    dtype: str | None
    calls: list[CallReplay] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.calls) and all(c.passed for c in self.calls)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "passed": self.passed, "mode": self.mode, "device": self.device,
                "dtype": self.dtype, "notes": self.notes, "calls": [c.to_dict() for c in self.calls]}

    def __str__(self) -> str:
        lines = [f"replay {self.ref} on {self.device} ({self.mode}): {'PASS' if self.passed else 'FAIL'}"]
        for c in self.calls:
            status = "pass" if c.passed else "FAIL"
            detail = c.error or (c.worst.message if c.worst else f"{len(c.leaves)} leaves match")
            worst_abs = max((leaf.max_abs_error for leaf in c.leaves), default=0.0)
            lines.append(f"  call {c.index}: {status}  max abs err {worst_abs:.3g}  {detail}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        """Jupyter: the verdict (coloured) and one table row per call."""
        from modulelens.interfaces.html import replay_html

        return replay_html(self)


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
        stack.enter_context(torch.set_grad_enabled(call.grad_enabled))
        for device_type, dtype in call.autocast.items():
            if device_type == device.type:
                stack.enter_context(torch.autocast(device_type, dtype=getattr(torch, dtype)))
        yield


def recorded_device_type(capture: Capture) -> str:
    devices = {e.get("device", "cpu").split(":")[0] for e in capture.metadata["tensors"].values()}
    devices.discard("cpu")
    return devices.pop() if len(devices) == 1 else "cpu"


def replay(
    capture: Capture,
    *,
    calls: Sequence[int] | None = None,
    exact: bool | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    module: torch.nn.Module | None = None,
) -> ReplayReport:
    device = capture.device or torch.device("cpu")
    cross_device = recorded_device_type(capture) != device.type
    # Recorded from sharded (DTensor) computation: its reductions ran in another order across ranks.
    sharded = bool(capture.metadata.get("distributed", {}).get("sharded"))
    if exact is None:
        exact = not cross_device and not sharded and capture.dtype is None and rtol is None and atol is None
    report = ReplayReport(ref=capture.ref, mode="bit-exact" if exact else "tolerance", device=str(device),
                          dtype=str(capture.dtype).removeprefix("torch.") if capture.dtype else None)
    target = module if module is not None else capture.module
    report.notes.extend(capture.notes)
    if sharded:
        report.notes.append("recorded from sharded (DTensor) computation: compared within tolerance")
    selected = range(len(capture.calls)) if calls is None else calls
    for position in selected:
        call = capture.calls[position]
        result = CallReplay(call=position, index=call.index, passed=False)
        report.calls.append(result)
        if not call.finished:
            result.error = "the recorded call did not finish (it raised in the original job)"
            continue
        try:
            if module is None:
                capture.use_state(call.state_index)
            args, kwargs = call.fresh_inputs(capture.device, capture.dtype)
            target.train(call.training)
            with call_context(call, device):
                start = time.perf_counter()
                output = target(*args, **kwargs)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                result.seconds = time.perf_counter() - start
        except Exception as error:  # report, don't crash: the next call may still work
            result.error = f"{type(error).__name__}: {error}"
            continue
        result.leaves = compare(call.output, output, exact=exact, rtol=rtol, atol=atol,
                                cross_device=cross_device or sharded)
        result.passed = all(leaf.passed for leaf in result.leaves)
    if any(leaf.kind == "unrecorded" for c in report.calls for leaf in c.leaves):
        report.notes.append("some outputs were not recorded and could not be compared")
    return report

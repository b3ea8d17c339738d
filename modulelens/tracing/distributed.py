"""Capture inside distributed jobs: which ranks record, and sharded values gathered without hangs.

Rules (see docs/distributed.md):

- ``ranks`` picks the recording ranks (``[0]`` by default, a list, or ``"all"``); every other rank
  keeps its hooks only to take part in gathers, and saves nothing.
- A ``DTensor`` (FSDP2 ``fully_shard``, tensor parallel ``parallelize_module``, DTensor inputs and
  outputs) is stored as its full tensor. ``DTensor.full_tensor()`` is a collective, so before any
  gather the ranks of the DTensors' device meshes agree through the job's key-value store (not a
  collective: bounded by ``sync_timeout``) that each of them reached the same call with the same
  list of tensors to gather. Only then does every one of them gather, in the same order. When they
  do not agree in time, nobody gathers, the call is dropped on every rank and the capture is marked
  incomplete; the job goes on.
- Gathers happen only inside the forward hooks of a targeted module, and only on meshes that hold a
  recording rank.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.utils._pytree as pytree

from modulelens.errors import UsageError
from modulelens.format.tree import Flattened

if TYPE_CHECKING:
    from torch.distributed import Store
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    from modulelens.tracing.records import ModuleRecord
    from modulelens.tracing.tracer import Tracer

RanksSpec = Sequence[int] | int | str


# ------------------------------------------------------------------------------------------ ranks


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size: from the process group, else torchrun's env vars."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = os.environ.get("RANK", "")
    world = os.environ.get("WORLD_SIZE", "")
    return (int(rank) if rank.isdigit() else 0), (int(world) if world.isdigit() else 1)


def normalise_ranks(spec: RanksSpec) -> str | list[int]:
    """Validate ``ranks=``: ``"all"``, one rank, a list of ranks, or a comma-separated string of
    ranks as the ``modulelens run --ranks`` option takes (``"0,3"``). Returns ``"all"`` or a list."""
    if isinstance(spec, str):
        text = spec.strip()
        if text == "all":
            return "all"
        parts = [p.strip() for p in text.split(",")]
        if not text or not all(p.isdigit() for p in parts):
            raise UsageError(f"ranks={spec!r}: use a list of ranks or 'all'")
        spec = [int(p) for p in parts]
    if isinstance(spec, bool):
        raise UsageError(f"ranks={spec!r}: use a list of ranks or 'all'")
    if isinstance(spec, int):
        spec = [spec]
    try:
        ranks = sorted({int(r) for r in spec if not isinstance(r, bool)})
    except (TypeError, ValueError):
        raise UsageError(f"ranks={spec!r}: use a list of ranks or 'all'") from None
    if not ranks or ranks[0] < 0 or len(ranks) != len(list(spec)):
        raise UsageError(f"ranks={spec!r}: use a non-empty list of distinct ranks >= 0, or 'all'")
    return ranks


def recording_ranks(spec: str | list[int], world_size: int) -> frozenset[int]:
    if isinstance(spec, str):  # "all" (normalise_ranks returns no other string)
        return frozenset(range(world_size))
    return frozenset(r for r in spec if r < world_size)


def several_recorders(spec: str | list[int], world_size: int) -> bool:
    """Whether capture names need a ``rank<k>`` segment: more than one rank records."""
    return len(recording_ranks(spec, world_size)) > 1


# ---------------------------------------------------------------------------------- wrapper classes


def original_class(cls: type) -> type:
    """The user's class under the classes composable wrappers swap in: FSDP2 ``fully_shard`` makes
    ``FSDP<Cls>(FSDPModule, Cls)``, ``replicate`` makes ``Replicate<Cls>``/``DDP<Cls>``."""
    for _ in range(8):
        bases = cls.__bases__
        if (
            len(bases) == 2
            and bases[0].__module__.startswith("torch.distributed.")
            and cls.__name__.endswith(bases[1].__name__)
            and cls.__name__ != bases[1].__name__
        ):
            cls = bases[1]
        else:
            break
    return cls


# ---------------------------------------------------------------------------------------- DTensors


def dtensor_type() -> type[DTensor] | None:
    """The DTensor class, or ``None`` when no DTensor can exist: importing
    ``torch.distributed.tensor`` (sympy, symbolic shapes) took ~4 s of a first capture (issue 11),
    and a job that has DTensors has imported it already. Once found the class is kept: the tracer
    asks several times per recorded call, and an import statement each time cost more than the
    check it guards (benchmarks/bench_recording.py)."""
    global _DTENSOR
    if _DTENSOR is not None:
        return _DTENSOR
    if not torch.distributed.is_available():
        return None
    if "torch.distributed.tensor" not in sys.modules and "torch.distributed._tensor" not in sys.modules:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    _DTENSOR = DTensor
    return DTensor


_DTENSOR: type[DTensor] | None = None  # dtensor_type(), once the job imported it


def is_dtensor(value: object) -> TypeGuard[DTensor]:
    cls = dtensor_type()
    return cls is not None and isinstance(value, cls)


def dtensor_leaves(tree: object) -> list[tuple[str, DTensor]]:
    """``(path, dtensor)`` for each distinct DTensor leaf of ``tree``, in pytree order."""
    cls = dtensor_type()
    if cls is None:
        return []
    flat = Flattened.of(tree)
    if not any(isinstance(leaf, cls) for leaf in flat.leaves):
        return []  # the common case, without the key paths (every recorded call asks, twice)
    found: list[tuple[str, DTensor]] = []
    seen: set[int] = set()
    for key_path, leaf in pytree.tree_flatten_with_path(flat.tree)[0]:
        if isinstance(leaf, cls) and id(leaf) not in seen:
            seen.add(id(leaf))
            found.append((pytree.keystr(key_path), leaf))
    return found


def mesh_ranks(dtensor: DTensor) -> tuple[int, ...]:
    return tuple(int(r) for r in dtensor.device_mesh.mesh.flatten().tolist())


def describe_mesh(mesh: DeviceMesh) -> dict[str, object]:
    return {
        "device_type": str(mesh.device_type),
        "shape": list(mesh.mesh.shape),
        "dim_names": list(mesh.mesh_dim_names or []),
        "ranks": [int(r) for r in mesh.mesh.flatten().tolist()],
    }


def describe_dtensor(dtensor: DTensor) -> dict[str, object]:
    return {
        "shape": list(dtensor.shape),
        "local_shape": list(dtensor.to_local().shape),
        "dtype": str(dtensor.dtype).removeprefix("torch."),
        "placements": [repr(p) for p in dtensor.placements],
        "mesh": describe_mesh(dtensor.device_mesh),
    }


def signature(dtensors: Iterable[DTensor]) -> str:
    """What a rank is about to gather: every rank of the mesh must be about to gather the same."""
    text = ";".join(
        f"{tuple(t.shape)}|{t.dtype}|{','.join(repr(p) for p in t.placements)}|{mesh_ranks(t)}" for t in dtensors
    )
    return hashlib.sha1(text.encode()).hexdigest()


def full_tensor(dtensor: Any) -> torch.Tensor:  # Any: torch types DTensor.detach() as a plain Tensor
    """The whole tensor of a DTensor (a collective on its mesh), detached and waited for."""
    with torch.no_grad():
        full = dtensor.detach().full_tensor()
    wait = getattr(full, "wait", None)  # AsyncCollectiveTensor
    if type(full) is not torch.Tensor and callable(wait):
        full = wait()
    return full


# ------------------------------------------------------------------------------------- agreement


class ShardSync:
    """Bounded agreement among the ranks of a mesh through the job's key-value store.

    Every rank that reaches a gather point writes what it is about to gather and bumps an arrival
    counter, then polls. The first rank to see a decision writes it with ``compare_set`` (so every
    rank reads the same one): ``go`` once all ranks arrived with equal signatures, otherwise
    ``abort:<why>`` (deadline passed, signatures differ, a rank dropped the target). Store calls
    are point-to-point with the store server, never collectives, so a missing rank cannot block
    anyone for longer than ``timeout`` seconds.
    """

    def __init__(self, session: str, timeout: float) -> None:
        self.prefix = f"modulelens/{session}"
        self.timeout = timeout
        self._store: Store | None = None

    def _get_store(self) -> Store:
        if self._store is None:
            from torch.distributed import distributed_c10d

            self._store = distributed_c10d._get_default_store()
        return self._store

    def agree(self, point: str, target: str, group: Sequence[int], sig: str) -> str | None:
        """``None`` when every rank of ``group`` is at ``point`` with signature ``sig``, else why not."""
        try:
            store = self._get_store()
        except Exception as error:
            return f"no key-value store to agree on a gather ({error})"
        rank = torch.distributed.get_rank()
        group_id = hashlib.sha1(",".join(map(str, group)).encode()).hexdigest()[:12]
        base = f"{self.prefix}/{point}/{group_id}"
        decision_key = f"{base}/decision"
        dropped_key = self._dropped_key(target)
        store.set(f"{base}/sig/{rank}", sig)
        store.add(f"{base}/arrived", 1)
        deadline = time.monotonic() + self.timeout
        delay = 0.0005
        while True:
            if store.check([decision_key]):
                decision = store.get(decision_key).decode()
                break
            proposal = None
            if store.add(f"{base}/arrived", 0) >= len(group):
                sigs = {r: store.get(f"{base}/sig/{r}").decode() for r in group}
                odd = sorted(r for r, s in sigs.items() if s != sig)
                proposal = "go" if not odd else f"abort:ranks {odd} were about to gather different tensors"
            elif store.check([dropped_key]):
                proposal = f"abort:{store.get(dropped_key).decode()}"
            elif time.monotonic() > deadline:
                missing = [r for r in group if not store.check([f"{base}/sig/{r}"])]
                proposal = f"abort:ranks {missing} did not reach this call within {self.timeout:g}s"
            if proposal is not None:
                decision = store.compare_set(decision_key, "", proposal).decode()
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return None if decision == "go" else decision.removeprefix("abort:")

    def mark_dropped(self, target: str, reason: str) -> None:
        """Tell the other ranks to stop waiting for this rank at ``target``'s gathers."""
        try:
            rank = torch.distributed.get_rank()
            self._get_store().set(self._dropped_key(target), f"rank {rank} dropped the target ({reason})")
        except Exception:
            pass  # best effort: the others then wait out their timeout

    def _dropped_key(self, target: str) -> str:
        return f"{self.prefix}/dropped/{target or '<root>'}"


# ---------------------------------------------------------------------------------------- metadata


def capture_metadata(tracer: Tracer, record: ModuleRecord, sharding: dict[str, dict[str, dict[str, Any]]],
                     incomplete: list[str]) -> dict[str, object] | None:
    """The ``distributed`` block of a capture's metadata: rank, world, backend, recording ranks, the
    wrapper class, device meshes and the placements of sharded tensors (stored full), and why the
    capture is incomplete. ``None`` for a plain single-process capture of unsharded tensors."""
    notes = {k: {p: dict(e) for p, e in v.items()} for k, v in sharding.items()}
    module = record.module
    wrapper = None
    if module is not None:
        if original_class(type(module)) is not type(module):
            wrapper = type(module).__name__
        state = (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False))
        for state_name, tensor in state:  # outside forward: as sharded between calls
            if is_dtensor(tensor):
                notes.setdefault("parameters", {})[state_name] = describe_dtensor(tensor)
    if tracer.world_size <= 1 and not notes and wrapper is None:
        return None
    meshes: list[dict[str, Any]] = []
    for group in notes.values():
        for entry in group.values():
            if entry["mesh"] not in meshes:
                meshes.append(entry["mesh"])
            entry["mesh"] = meshes.index(entry["mesh"])
    env = tracer.environment
    return {
        "rank": env.get("rank", tracer.rank),
        "world_size": env.get("world_size", tracer.world_size),
        "local_rank": env.get("local_rank"),
        "backend": env.get("backend"),
        "ranks": tracer.ranks,
        "recording_ranks": sorted(recording_ranks(tracer.ranks, tracer.world_size)),
        "wrapper_class": wrapper,
        "sharded": bool(notes),
        "stored": "full tensors (DTensors gathered on their meshes)",
        "meshes": meshes,
        "parameters": notes.get("parameters", {}),
        "inputs": notes.get("inputs", {}),
        "outputs": notes.get("output", {}),
        "incomplete": list(incomplete),
    }

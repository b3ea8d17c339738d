"""A recorded call's weights written straight from the live tensors, in the background (issue 25).

Copying a module's weights when a call is recorded doubled the job's memory for as long as the
capture was kept (+1 GiB for a 1 GiB module) and made that call 3-4x slower (the copy). Instead,
each large parameter of a recorded call's state is streamed by a background thread, straight from
the tensor's own memory, into a blob writer of the repo the capture goes to
(:meth:`~modulelens.repo.repository.Repo.blob_writer`, repo/blob_writer.py), which hashes it as it
goes (the content hash that names the blob and the verification marker's chunk hashes) and flushes
it when sealed; the save moves the file in as the blob without reading it again
(:class:`~modulelens.repo.store.WrittenPayload`). This module opens no file for writing: the
store's writer is the one byte path of blobs (tests/test_architecture.py keeps it so). A small module's large
weights are still copied, until a capture's copies reach :data:`COPY_BUDGET`: for a few MiB the
copy costs the job less than a file, a thread and a flush per recorded call.

What is written must be what the call started with. The module's own forward runs while the
writer reads (it does not change its parameters; buffers, which a forward may update in place,
such as batch-norm statistics, are copied as before). Once the recorded call returns, the weights
can change: an optimizer step, ``p.data.add_``, ``load_state_dict``, another thread. Waiting for the
write at the end of every recorded call (as this module did first) cost a GPT-2-small training step
1.20x (issue 37): the disk took 28 MB a block at ~450 MB/s while the block's forward took 20 ms. So
a recorded call on the CPU returns at once and the write goes on until the first point where a
training job changes weights, where it is settled (:meth:`WeightWriter.settle`: wait until at most
:data:`SETTLE_BUDGET_FRACTION` of the weights, at most :data:`SETTLE_BUDGET_MAX` bytes, is left to
write, copy that, and return; the rest is written from the copy):

* before any ``torch.optim`` optimizer's step (one process-wide step pre-hook, ``_StepGuard``);
* when a backward reaches the call's output (before any gradient of its weights exists, so
  before an optimizer stepped inside the backward, on ``register_post_accumulate_grad_hook``, can
  run), which also comes before the update of a hand-written loop (``p.data.add_(-lr * p.grad)``);
* before a ``load_state_dict`` into a recorded module or a module holding it (other weights swapped
  in, as for an evaluation with EMA weights; :func:`settle_before_load`), and at the end of a
  target's last recorded call, where that hook goes with the target's others (there the write is
  waited for to its end, nothing copied, as at a stop below);
* when the capture stops or is saved, which wait until every write has read its live tensor to
  the end and copy nothing (``settle(whole=True)``): the big capture's peak memory varied 7-23 MiB
  between rounds at 1 GiB while a stop copied the last 1/32 of whatever was left.

A change anywhere else (``p.data.add_`` with no backward between, as evolution strategies perturb
weights) while a write is still reading is caught, never stored: the version counter, and the
weight's fingerprint against the bytes written, are checked when the reading ends, and such a
weight is left out of the capture with a warning that names it (loading the capture then refuses,
naming it missing, as for a weight whose write failed). ``Recording(settle_at_return=True)``
settles at the end of every recorded call instead, for such jobs; so does a call on a CUDA device
(its reads run on a side stream that must not outlive the call's ordering, below).

A tensor's version counter is checked when the call ends, and the content written is checked
against the weight's fingerprint (tracing/fingerprint.py) when it is done: a forward that changed
its own parameter in place while it was being read is named in a warning, never stored silently.

On CUDA the writer copies each piece to a bounded pinned buffer on a side stream that first waits
for the work queued before the call, and the copy at the end of the call is queued on the job's
stream, ahead of anything the job queues later. (This path is exercised on CPU tensors in the
tests, with the same buffer logic; it has not run on a GPU.)
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from modulelens.errors import CaptureWarning
from modulelens.format.tensors import address_offset
from modulelens.repo.store import BlobWriter, WrittenPayload
from modulelens.tracing.fingerprint import bit_sum_width, sums_bits
from modulelens.tracing.module_hooks import load_state_dict_pre_hook
from modulelens.tracing.snapshot import ADDRESS_ATTR

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

    from torch.utils.hooks import RemovableHandle

#: Parameters of this size or smaller are copied (one file each would cost more than the copy; the
#: same bound as the fingerprints hashed in place, so every streamed weight's is a sum of its bits).
STREAM_MIN_BYTES = 1 << 20
#: At the end of a recorded call at most this fraction of its streamed weights is left unwritten
#: (and copied), and at most :data:`SETTLE_BUDGET_MAX` bytes. The copy is the memory a capture adds
#: to the job: 1/32 keeps it under issue 37's 5% of the weights with room for the rest (at 1/16 a
#: 1 GiB module's call copied 64 MiB, 6.25%).
SETTLE_BUDGET_FRACTION = 1 / 32
SETTLE_BUDGET_MAX = 64 << 20
#: Large weights are copied, as small ones are, until the copies one capture holds would pass this
#: many bytes; only then are they streamed. Streaming costs a staging file, a thread and a flush
#: per recorded call, which the demo RecModel's 1.2 MiB embedding paid at every recorded training
#: step (bench_capture.py; README, "Training-step overhead"). The bound is the most one streamed
#: call may copy at its end anyway (:data:`SETTLE_BUDGET_MAX`): a capture's copies of large
#: weights never add more than that to the job's memory, whatever the module's size.
COPY_BUDGET = SETTLE_BUDGET_MAX
_PIECE = 16 << 20  # bytes written (and, on a device, copied to the pinned buffer) at a time
_STORED_ATTR = "_modulelens_written"  # the WrittenPayload of a streamed weight, once written
_INT64 = 1 << 64

#: Gives a blob writer of the repo a capture is saved into for a payload of so many bytes
#: (``Repo.blob_writer``), or ``None`` when nothing can be staged (the weights are then copied).
BlobSink = Callable[[int], BlobWriter | None]


def written_payload(tensor: torch.Tensor) -> WrittenPayload | None:
    """The file a streamed weight was written to (what encoding stores instead of its bytes)."""
    return getattr(tensor, _STORED_ATTR, None)


def can_stream(tensor: torch.Tensor) -> bool:
    """A plain, contiguous tensor of more than :data:`STREAM_MIN_BYTES` on the CPU or a CUDA device."""
    return (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.layout == torch.strided
            and not tensor.is_quantized and tensor.device.type in ("cpu", "cuda") and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() > STREAM_MIN_BYTES)


class _HostReader:
    """Pieces of a CPU tensor's bytes, read where they are."""

    def __init__(self, flat: torch.Tensor) -> None:
        self._bytes = memoryview(flat.numpy()).toreadonly()  # type: ignore[arg-type]  # numpy's stubs declare __buffer__ for Python 3.12+ only

    def read(self, start: int, end: int) -> memoryview:
        return self._bytes[start:end]

    def copy_rest(self, start: int) -> memoryview:
        return memoryview(bytes(self._bytes[start:]))

    def close(self) -> None:
        self._bytes.release()


class _BufferedReader:
    """Pieces of a device tensor's bytes, through one pinned host buffer of :data:`_PIECE` bytes
    (allocated when the writer gets to this tensor, freed when it is done with it).

    Reads run on a side stream that first waits for an event recorded when the call started: the
    weights as the call sees them, whatever the job queues later. The copy of the rest at the end
    of the call is queued on the job's own stream, so the kernels it queues afterwards (an
    optimizer step) run after it. Without CUDA (the tests) the same logic runs on host memory."""

    def __init__(self, flat: torch.Tensor) -> None:
        self._flat = flat
        self._cuda = flat.device.type == "cuda"
        self._started: Any = None
        if self._cuda:
            self._started = torch.cuda.Event()
            self._started.record(torch.cuda.current_stream(flat.device))
        self._stream: Any = None
        self._buffer: torch.Tensor | None = None
        self._rest: torch.Tensor | None = None
        self._rest_at = 0
        self._rest_ready: Any = None

    def read(self, start: int, end: int) -> memoryview:
        if self._rest is not None and start >= self._rest_at:
            if self._rest_ready is not None:
                self._rest_ready.synchronize()
            return memoryview(self._rest.numpy())[start - self._rest_at:end - self._rest_at]  # type: ignore[arg-type]  # numpy's stubs declare __buffer__ for Python 3.12+ only
        if self._buffer is None:
            self._buffer = torch.empty(min(_PIECE, self._flat.numel()), dtype=torch.uint8, pin_memory=self._cuda)
            if self._cuda:
                self._stream = torch.cuda.Stream(self._flat.device)
                self._stream.wait_event(self._started)
        piece = self._buffer[:end - start]
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                piece.copy_(self._flat[start:end], non_blocking=True)
            self._stream.synchronize()
        else:
            piece.copy_(self._flat[start:end])
        return memoryview(piece.numpy())  # type: ignore[arg-type]  # numpy's stubs declare __buffer__ for Python 3.12+ only

    def copy_rest(self, start: int) -> None:
        rest = self._flat[start:]
        self._rest = torch.empty(rest.numel(), dtype=torch.uint8, pin_memory=self._cuda)
        self._rest_at = start
        if self._cuda:
            self._rest.copy_(rest, non_blocking=True)  # on the job's stream: before its later kernels
            self._rest_ready = torch.cuda.Event()
            self._rest_ready.record()
        else:
            self._rest.copy_(rest)
        self._flat = self._flat[:start]  # the live tensor's rest is never read again

    @property
    def buffer_bytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def close(self) -> None:
        self._flat = self._buffer = self._rest = self._stream = None  # type: ignore[assignment]


class _Waiters:
    """Whether anyone waits on the writes now (a settle, the save). While no one does, the job is
    running, and the writer thread works alone: with the blob writer hashing beside each write and
    the bits summed on a third thread, a job's thread doing small torch ops on a two-core machine
    ran 1.66-2.2x slower while 28 MB weights were written beside it, 1.03x with the writer alone
    (docs/fidelity.md, "Large weights are written after the call returns"). While someone waits
    the job is not running, and the helpers finish the writes sooner (a big capture's save)."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @property
    def now(self) -> bool:
        return self._count > 0

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1


class StreamedWeight:
    """One weight on its way into the repo.

    Args:
        tensor: the live parameter (its bytes are read, never copied, until the call ends).
        writer: the repo's blob writer it streams into (:meth:`Repo.blob_writer`).
        fingerprint: the weight's fingerprint when the call started (tracing/fingerprint.py), to
            check what was written against.
        name: the parameter's name, for messages.
        buffered: read through a bounded buffer (default: for a tensor on a device; the tests force
            it on CPU tensors, where no GPU is available).
    """

    def __init__(self, tensor: torch.Tensor, writer: BlobWriter, fingerprint: int | None, name: str, *,
                 buffered: bool | None = None) -> None:
        self.name = name
        self.writer = writer
        self.alias = tensor.detach()  # the storage as the call started (a later `p.data = x` leaves it)
        flat = self.alias.reshape(-1).view(torch.uint8)
        self.nbytes = flat.numel()
        self.version = tensor._version
        self.fingerprint = fingerprint if sums_bits(tensor) else None
        self._width = np.dtype(str(bit_sum_width(tensor)).removeprefix("torch."))
        self.buffered = tensor.device.type != "cpu" if buffered is None else buffered
        self._reader: Any = _BufferedReader(flat) if self.buffered else _HostReader(flat)
        self.written = 0
        self._copied_from: int | None = None  # where the copy of the rest starts, once taken
        self._copy: memoryview | None = None
        self.lock = threading.Lock()
        self.progress = threading.Condition(self.lock)
        self.read_all = False  # every byte is read (from the live tensor or the copy of its rest)
        self.done = threading.Event()  # written, hashed and flushed (or failed)
        self.error: BaseException | None = None
        self.payload: WrittenPayload | None = None
        self.changed: str | None = None  # why what was written is not what the call started with
        # Whether the call returned with this weight still being read from the live tensor (settled
        # later, module docstring); None until it returns. A change found then may have come after
        # the call, so nothing right can be stored: ``after_return`` (the weight is left out).
        self.deferred: bool | None = None
        self.after_return = False

    @property
    def reading_live(self) -> bool:
        """Whether the live tensor may still be read (nothing copied yet, not all of it read)."""
        return not self.read_all and self._copied_from is None

    @property
    def left(self) -> int:
        """Bytes still to be read from the live tensor (0 once its rest is copied)."""
        return 0 if self._copied_from is not None or self.read_all else self.nbytes - self.written

    def _read(self, start: int, end: int) -> memoryview:
        if self._copy is not None and start >= self._copied_from:  # type: ignore[operator]
            return self._copy[start - self._copied_from:end - self._copied_from]  # type: ignore[operator]
        return self._reader.read(start, end)

    def returned(self) -> bool:
        """The recorded call returned: whether the write may go on reading the live tensor until it
        is settled (a CPU tensor whose version counter has not moved since the call started)."""
        if self.deferred is None:
            self.deferred = not self.buffered and self.alias._version == self.version
        return self.deferred

    def _check_version(self) -> None:
        """Name a change of the live tensor's version counter since the call started (the reading
        from it ends now: the rest, if any, comes from a copy)."""
        if self.changed or self.alias._version == self.version:
            return
        if self.deferred:
            self.after_return = True
            self.changed = "it was changed in place after the call returned, before it was written"
        else:
            self.changed = "its version counter moved during the call (changed in place by the forward)"

    def copy_rest(self) -> None:
        """Copy what is not written yet (the weights may change from now on)."""
        with self.lock:
            if self.read_all or self._copied_from is not None:
                return
            self._check_version()
            self._copied_from = self.written
            copy = self._reader.copy_rest(self.written)
            if copy is not None:
                self._copy = copy

    def write(self, beside: Executor | None = None, waited_on: _Waiters | None = None) -> bool:
        """Stream the whole weight into its writer (the background thread's work); ``True`` when
        every byte was written, for :meth:`flush` (by a second thread, so the disk flushes this
        weight while the next is written); ``False`` after an error (the writer aborted).
        ``beside``: sums each piece's bits (the fingerprint check) on that thread while the writer
        writes and hashes it, instead of after (the write waits on the disk; the sum on nothing).
        ``waited_on``: helper threads (``beside``, the writer's hashing beside its write) work only
        while someone waits on the writes (:class:`_Waiters`); otherwise this thread does it all."""
        try:
            piece = self.writer.chunk * max(1, _PIECE // self.writer.chunk)  # whole chunks: hashed in place
            bit_sum = 0
            while self.written < self.nbytes:
                with self.lock:
                    start, end = self.written, min(self.written + piece, self.nbytes)
                    view = self._read(start, end)
                    hurry = waited_on is None or waited_on.now
                    summed = self._sum_bits(view, beside if hurry else None)
                    try:
                        self.writer.write(view, beside=hurry)
                    finally:
                        if summed is not None:
                            bit_sum += summed.result()  # (the piece's memory may be reused from here on)
                    if self.fingerprint is not None and summed is None:
                        bit_sum += self._bits(view)
                    if end == self.nbytes and self._copied_from is None:
                        self._check_version()  # all of it read from the live tensor
                    self.written = end
                    self.progress.notify_all()
            if self.fingerprint is not None and not self.changed and _wrapped(bit_sum) != self.fingerprint:
                if self.deferred:  # through .data, during the call or after it: either way not the call's
                    self.after_return = True
                    self.changed = "what was written does not match its fingerprint at the start of the call " \
                                   "(changed through .data during the call, or after it returned, before it " \
                                   "was written)"
                else:
                    self.changed = "what was written does not match its fingerprint at the start of the call " \
                                   "(changed in place during the call)"
            return True
        except BaseException as error:  # reported by settle() or at the save: the job goes on
            self.error = error
            self.writer.abort()
            return False
        finally:
            with self.lock:
                self._reader.close()
                self._copy = None
                self.read_all = True
                self.progress.notify_all()

    def fail(self, error: BaseException) -> None:
        """Give up on this weight (its writer thread stopped before it): nothing is published, and
        whoever waits on it is woken (settle() returns it for a copy; the save leaves it out)."""
        with self.lock:
            if self.error is None:
                self.error = error
            self.payload = None
            self.read_all = True
            self.progress.notify_all()
        self.writer.abort()
        self.done.set()

    def _bits(self, view: memoryview) -> int:
        return int(np.frombuffer(view, dtype=self._width).sum(dtype=np.int64))

    def _sum_bits(self, view: memoryview, beside: Executor | None) -> Future[int] | None:
        if self.fingerprint is None or beside is None:
            return None
        try:
            return beside.submit(self._bits, view)
        except RuntimeError:  # interpreter shutdown: summed after the write
            return None

    def flush(self, written: bool) -> None:
        """Seal what was written (durable, as a save is), then mark the weight done."""
        try:
            if written:
                self.payload = self.writer.seal()
        except BaseException as error:  # (the writer removed its file)
            self.error, self.payload = error, None
        finally:
            self.done.set()


class WeightWriter:
    """Streams the large parameters of recorded calls into the repo, one thread per call's state.

    Args:
        blob_writer: gives a blob writer of the repo for a payload of so many bytes
            (``Repo.blob_writer``), or ``None`` when nothing can be staged (then weights are
            copied, as before).
    """

    def __init__(self, blob_writer: BlobSink) -> None:
        self._blob_writer = blob_writer
        self._pending: list[StreamedWeight] = []
        self._live: list[StreamedWeight] = []  # may still be reading a live tensor (until settled)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._copied = 0  # bytes of large weights left to the caller to copy (COPY_BUDGET)
        self._waiters = _Waiters()

    def start(self, weights: dict[str, tuple[torch.Tensor, int | None]]) -> dict[str, StreamedWeight]:
        """Start writing ``{name: (live tensor, fingerprint)}``, one call's large weights; returns
        the streamed ones by name. The others are for the caller to copy: all of them while the
        copies fit in :data:`COPY_BUDGET`, and those after a blob writer could not be had."""
        nbytes = sum(tensor.numel() * tensor.element_size() for tensor, _ in weights.values())
        with self._lock:
            if self._copied + nbytes <= COPY_BUDGET:
                self._copied += nbytes
                return {}
        streamed: dict[str, StreamedWeight] = {}
        for name, (tensor, fingerprint) in weights.items():
            try:
                writer = self._blob_writer(tensor.numel() * tensor.element_size())
            except Exception:  # fail open: this weight and the rest are copied instead
                break
            if writer is None:
                break
            try:
                streamed[name] = StreamedWeight(tensor, writer, fingerprint, name)
            except Exception:
                writer.abort()
                break
        if streamed:
            jobs = list(streamed.values())
            thread = threading.Thread(target=_write_all, args=(jobs, self._waiters), name="modulelens-weights", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no new threads (interpreter shutdown): copied instead
                for job in jobs:
                    job.writer.abort()
                return {}
            with self._lock:
                self._pending.extend(jobs)
                self._live.extend(jobs)
                self._threads.append(thread)
        return streamed

    def failed(self) -> bool:
        """Whether a write failed and its weight is still to be copied (by :meth:`settle`)."""
        with self._lock:
            return any(job.error is not None and job.payload is None for job in self._pending)

    def returned(self, owner: SettlesWeights, outputs: list[Any], *, at_return: bool) -> bool:
        """A recorded call of ``owner`` returned with ``outputs`` (its output's leaves): whether its
        caller must settle now. Not when every write still reading a live tensor may go on
        (:meth:`StreamedWeight.returned`) and is settled later: before the next optimizer step
        and when a backward reaches ``outputs``. ``at_return``: settle now (the caller knows why).
        A failed write is always settled now (then copied, while it is what the call saw)."""
        if self.failed():
            return True
        with self._lock:
            self._live = [job for job in self._live if job.reading_live]
            live = list(self._live)
        if not live:
            return False
        if at_return or not all([job.returned() for job in live]):  # (every job asked: each notes the return)
            return True
        grads = [leaf for leaf in outputs if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
        if not _settle_on_backward(owner, grads):
            return True
        _STEP_GUARD.watch(owner)
        return False

    def settle(self, *, whole: bool = False) -> list[StreamedWeight]:
        """Wait until little is left to read from the live weights, copy that, and return (before
        the weights may change); ``whole``: wait until nothing is left (no copy). What failed to
        write is returned for the caller to copy instead."""
        with self._lock:
            pending = [job for job in self._live if job.reading_live]
        total = sum(job.nbytes for job in pending)
        budget = 0 if whole else min(SETTLE_BUDGET_MAX, int(total * SETTLE_BUDGET_FRACTION))
        with self._waiters.waiting():
            for job in pending:  # in writing order: the thread writes them one after the other
                with job.lock:
                    while not job.read_all and sum(j.left for j in pending) > budget:
                        job.progress.wait(0.05)
        for job in pending:
            job.copy_rest()
        with self._lock:
            self._live = [job for job in self._live if job.reading_live]
            failed = [job for job in self._pending if job.error is not None and job.payload is None]
            self._pending = [job for job in self._pending if job not in failed]
        return failed

    def finish(self) -> list[StreamedWeight]:
        """Wait for every write; returns the weights written (each with its payload or error).
        Meanwhile the job may reach a settling point (an optimizer step): :meth:`settle` still
        finds the writes reading live tensors."""
        with self._lock:
            threads, self._threads = self._threads, []
            jobs, self._pending = self._pending, []
        with self._waiters.waiting():
            for thread in threads:
                thread.join()
        return jobs


class SettlesWeights(Protocol):
    def settle_weights(self) -> None: ...


class _StepGuard:
    """One process-wide optimizer step pre-hook that settles the weights of every tracer that asked
    (:meth:`watch`, held weakly). Registered once and never removed: a hook removed while a step
    walks the hooks on another thread would break that step ("dictionary changed size")."""

    def __init__(self) -> None:
        self._owners: weakref.WeakSet[SettlesWeights] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._registered = False

    def watch(self, owner: SettlesWeights) -> None:
        with self._lock:
            self._owners.add(owner)
            if not self._registered:
                from torch.optim.optimizer import register_optimizer_step_pre_hook

                register_optimizer_step_pre_hook(self._before_step)
                self._registered = True

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with self._lock:
            owners = list(self._owners)
        for owner in owners:
            try:
                owner.settle_weights()
            except Exception as error:  # fail open: the job's step goes on
                warnings.warn(f"modulelens: settling recorded weights before an optimizer step failed: {error}",
                              CaptureWarning, stacklevel=2)


_STEP_GUARD = _StepGuard()


def _write_all(jobs: list[StreamedWeight], waited_on: _Waiters) -> None:
    """Write the jobs one after the other; a second thread flushes each written file meanwhile, and
    while someone waits on the writes a third sums the bits of each piece while it is written
    (StreamedWeight.write)."""
    from concurrent.futures import ThreadPoolExecutor

    flusher: ThreadPoolExecutor | None = None
    summer: ThreadPoolExecutor | None = None
    try:
        flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-weights-flush")
        summer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-weights-sum")
    except RuntimeError:  # interpreter shutdown: flush and sum in this thread
        pass
    left = list(jobs)
    try:
        while left:
            job = left[0]
            written = job.write(summer, waited_on)
            del left[0]
            if flusher is None:
                job.flush(written)
            else:
                try:
                    flusher.submit(job.flush, written)
                except RuntimeError:  # shutting down meanwhile
                    job.flush(written)
    except BaseException as error:  # write() catches its own; anything else must not leave settle() waiting
        for job in left:            # forever: each weight left fails (copied by settle(), or named at the save)
            job.fail(error)
    finally:
        if summer is not None:
            summer.shutdown(wait=False)
        if flusher is not None:
            flusher.shutdown(wait=True)


def _wrapped(total: int) -> int:
    """``total`` as a wrapping int64 sum, as torch computes it."""
    total %= _INT64
    return total - _INT64 if total >= _INT64 // 2 else total


def mark_written(tensor: torch.Tensor, payload: WrittenPayload) -> torch.Tensor:
    """A read-only memory map of ``payload``'s file, shaped as ``tensor``, that encoding stores as
    that file (no copy in memory: the recorded weights stay on disk)."""
    mapped = torch.from_file(str(payload.path), shared=False, size=tensor.numel(), dtype=tensor.dtype)
    mapped = mapped.view(tensor.shape) if tensor.dim() else mapped.reshape(())
    setattr(mapped, _STORED_ATTR, payload)
    if tensor.device.type == "cpu" and (offset := address_offset(tensor)):
        setattr(mapped, ADDRESS_ATTR, offset)  # where the job's weight started (tracing/snapshot.py)
    return mapped


def settle_before_load(module: torch.nn.Module, owner: SettlesWeights) -> RemovableHandle:
    """Settle ``owner``'s weights before a ``load_state_dict`` reaches ``module`` (called on it or on
    a module holding it): swapping in other weights is a change like an optimizer step. ``owner``
    is held weakly; the caller removes the hook with the target's others."""
    return load_state_dict_pre_hook(module, _settler(owner))


def _settler(owner: SettlesWeights) -> Callable[..., None]:
    """A hook (any arguments) that settles ``owner``'s weights; ``owner`` is held weakly (the hook
    may outlive the capture, in torch's tables)."""
    held = weakref.ref(owner)

    def settle(*_: Any) -> None:
        found = held()
        if found is not None:
            found.settle_weights()
    return settle


def _settle_on_backward(owner: SettlesWeights, leaves: list[torch.Tensor]) -> bool:
    """Settle ``owner``'s weights when a backward reaches any of ``leaves`` (a recorded call's
    outputs that require grad: before any gradient of its weights exists); ``False`` when no hook
    could be set. ``owner`` is held weakly."""
    if not leaves:
        return True  # no backward runs through the call
    try:
        torch.autograd.graph.register_multi_grad_hook(leaves, _settler(owner), mode="any")
    except Exception:  # (a tensor of a torch.func transform, ...): the caller settles at once instead
        return False
    return True


def warn_after_return(job: StreamedWeight) -> None:
    """``job``'s weight changed after its call returned, before it was settled: it is left out."""
    job.error, job.payload = RuntimeError(job.changed), None
    warnings.warn(f"modulelens: parameter {job.name}: {job.changed}, not by an optimizer step or a backward "
                  "through the call (through .data?); not recorded (loading the capture names it missing). "
                  "Recording(settle_at_return=True) (modulelens run --settle-at-return) records a job that "
                  "changes weights that way",
                  CaptureWarning, stacklevel=3)


def warn_changed(target: str, job: StreamedWeight) -> None:
    warnings.warn(f"modulelens: {target or '<root>'}: parameter {job.name}: {job.changed}; the stored value is "
                  "not exactly the one the recorded call started with", CaptureWarning, stacklevel=3)

"""Writing a capture's payloads into a store: small ones packed, large ones hashed and written in a
pipeline of threads, those already written (:class:`~modulelens.repo.store.WrittenPayload`) moved
in. Written once over the :class:`~modulelens.repo.store.Store` interface; ``Repo.save_version`` calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from modulelens.format.hashing import hash_bytes
from modulelens.repo.markers import MARK_MIN_BYTES, chunk_digests
from modulelens.repo.packs import PACK_BELOW, pack_payloads
from modulelens.repo.store import Store, WrittenPayload

if TYPE_CHECKING:
    from concurrent.futures import Future

    from modulelens.repo.markers import ChunkDigests


def store_payloads(store: Store, metadata: dict[str, Any], payloads: dict[str, memoryview | WrittenPayload],
                   upgrade_layout: Callable[[], None]) -> None:
    """Hash and store every payload: small ones into packs, large ones as their own blobs, and
    those already written and hashed (:class:`WrittenPayload`) moved (or copied) in as they are."""
    written = {tid: p for tid, p in payloads.items() if isinstance(p, WrittenPayload)}
    adopted = []  # their folders flushed once, after every rename (one journal commit, not one each)
    for tid, payload in written.items():
        metadata["tensors"][tid]["payload"] = payload.digest
        if store.has_blob(payload.digest):
            pass
        elif payload.staged and store.adopt_file(payload.path, payload.digest, payload.chunks, flush=False):
            adopted.append(payload.digest)
        else:  # copied: re-hashing skipped only for this process's own staging file (issue 21)
            store.put_blob_file(payload.digest, payload.path, verified=payload.staged, missing=True)
        payload.path, payload.staged = store.blob_path(payload.digest), False  # (a second save)
    store.flush_blobs(adopted)
    views = {tid: _bytes_view(data) for tid, data in payloads.items() if not isinstance(data, WrittenPayload)}
    small = {tid: data for tid, data in views.items() if len(data) < PACK_BELOW}
    _write_payloads(store, metadata["tensors"], {t: d for t, d in views.items() if t not in small})
    if small:
        upgrade_layout()
        for digest, pack in pack_payloads(metadata, small):
            store.write_blob(digest, pack)


def _bytes_view(data: memoryview | bytes | bytearray) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" else view.cast("B")


def _write_payloads(store: Store, entries: dict[str, dict[str, Any]], payloads: dict[str, memoryview]) -> None:
    # A pipeline of three threads: the hashing thread hashes payload k+1 (blake3 itself uses
    # every core for large payloads) while this thread stages payload k and the publishing
    # thread waits for the disk (or the network) to take payload k-1. All three release the
    # GIL, so a save costs about the slowest of hashing, writing and flushing rather than their
    # sum (benchmarks/bench_save_load.py).
    if not payloads:  # (all small, packed: two thread pools made and shut down for nothing were a tenth of a small save)
        return
    from concurrent.futures import ThreadPoolExecutor  # here: listing a repo does not need threads

    items = list(payloads.items())
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-hash") as hasher, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-flush") as flusher:
            fingerprints = [hasher.submit(payload_fingerprint, data) for _, data in items]
            published: dict[str, Future[None]] = {}
            for (tid, data), fingerprint in zip(items, fingerprints, strict=True):
                digest, chunks = fingerprint.result()
                entries[tid]["payload"] = digest
                if digest not in published and not store.has_blob(digest):
                    published[digest] = flusher.submit(store.publish_blob, store.stage_blob(data), digest, chunks,
                                                       flush=False)
            for future in published.values():
                future.result()
    except RuntimeError as error:
        # A save from an atexit handler (`modulelens run` saving what a job recorded before it
        # ended) runs after concurrent.futures has shut down: "cannot schedule new futures
        # after interpreter shutdown". Do each step in this thread instead.
        if "interpreter shutdown" not in str(error):
            raise
        for tid, data in items:
            entries[tid]["payload"], chunks = payload_fingerprint(data)
            store.write_blob(entries[tid]["payload"], data, chunks=chunks)
        return
    store.flush_blobs(published)


def payload_fingerprint(data: memoryview) -> tuple[str, ChunkDigests | None]:
    """A payload's content hash, and its marker's chunk hashes when it gets a marker."""
    view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
    return hash_bytes(view), chunk_digests(view) if len(view) >= MARK_MIN_BYTES else None

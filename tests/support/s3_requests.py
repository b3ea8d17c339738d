"""Count the S3 requests this process sends (every S3 API call s3fs makes), by operation and key.

A counting wrapper around aiobotocore's one entry point for API calls, so tests and benchmarks pin
how many requests an operation costs against a real server (SeaweedFS) and a regression fails.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class S3Requests:
    """The requests sent within a :func:`counting_s3_requests` block: ``(operation, key)`` each
    (``PutObject``, ``GetObject``, ``HeadObject``, ``ListObjectsV2``...; the key or prefix)."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.calls)

    def by_operation(self) -> Counter[str]:
        return Counter(operation for operation, _ in self.calls)

    def payloads(self) -> int:
        """Requests about payloads (a blob looked for, uploaded, or uploaded in parts)."""
        return sum(1 for _, key in self.calls if "/blobs/" in f"/{key}")

    def others(self) -> int:
        """Requests about anything else: versions, the index, leases, the marker, listings."""
        return self.total - self.payloads()


@contextlib.contextmanager
def counting_s3_requests() -> Iterator[S3Requests]:
    """Within the block, every S3 API call of this process is recorded."""
    from aiobotocore.client import AioBaseClient

    seen = S3Requests()
    original = AioBaseClient._make_api_call

    async def counted(self: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
        seen.calls.append((operation_name, str(api_params.get("Key") or api_params.get("Prefix") or "")))
        return await original(self, operation_name, api_params)

    AioBaseClient._make_api_call = counted  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        AioBaseClient._make_api_call = original  # type: ignore[method-assign]

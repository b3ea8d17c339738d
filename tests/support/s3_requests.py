"""Count the S3 requests this process sends (every S3 API call s3fs makes, by operation name).

A counting wrapper around aiobotocore's one entry point for API calls, so the tests pin how many
requests an operation costs against a real server (SeaweedFS) and a regression fails.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def counting_s3_requests() -> Iterator[Counter[str]]:
    """Within the block, ``counts[operation]`` is how many S3 API calls were made (``PutObject``,
    ``GetObject``, ``HeadObject``, ``ListObjectsV2``...); ``sum(counts.values())`` all of them."""
    from aiobotocore.client import AioBaseClient

    counts: Counter[str] = Counter()
    original = AioBaseClient._make_api_call

    async def counted(self: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
        counts[operation_name] += 1
        return await original(self, operation_name, api_params)

    AioBaseClient._make_api_call = counted  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        AioBaseClient._make_api_call = original  # type: ignore[method-assign]

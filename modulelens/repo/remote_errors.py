"""What an object store's client raised, as one :class:`~modulelens.errors.RemoteRepoError` line.

s3fs, aiobotocore and aiohttp report a remote failure in many shapes: botocore's own errors
(``NoCredentialsError``, ``EndpointConnectionError``), a ``ClientError`` carrying the server's
answer, or an ``OSError`` that s3fs translated from one (``PermissionError`` for ``AccessDenied``,
``FileNotFoundError`` for ``NoSuchBucket``, ``OSError(EBUSY)`` for ``SlowDown``). Left as they
are, they reach the user as a 60-line traceback, or as the wrong exit code (a translated
``PermissionError`` reads as a local disk's, exit 8). :func:`remote_error` is the one table that
names each kind: no credentials, unreachable endpoint, missing bucket, permission denied,
throttling, another answer from the server; every :class:`~modulelens.repo._objects.FsspecObjects`
operation raises what it returns, so every command and the Python API say the same line (exit 7).

Types are recognised by name along the exception's cause chain, so nothing here imports botocore:
a repo on ``memory://`` or a local disk never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from modulelens.errors import RemoteRepoError

#: botocore's "nothing to sign with" family.
_NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                             "NoAuthTokenError", "UnauthorizedSSOTokenError", "SSOTokenLoadError", "TokenRetrievalError"})
#: Failures to reach the server at all (as opposed to an answer from it).
_NETWORK = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ClientConnectorError",
                      "ServerDisconnectedError", "ConnectionRefusedError", "ConnectionError", "ConnectionClosedError",
                      "TimeoutError", "ProxyConnectionError", "ClientOSError", "ServerTimeoutError", "FSTimeoutError",
                      "gaierror"})
#: Server answers (the S3 error code, or the HTTP status when there is no code) that mean "not allowed".
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                     "InvalidToken", "TokenRefreshRequired", "RequestTimeTooSkewed", "AccountProblem", "401", "403"})
#: ... that mean "too many requests, slow down" (SeaweedFS's circuit breaker answers ErrTooManyRequest).
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                        "RequestThrottledException", "TooManyRequests", "TooManyRequestsException", "RequestLimitExceeded",
                        "BandwidthLimitExceeded", "ServiceUnavailable", "ErrTooManyRequest", "429", "503"})


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it was raised from or while handling, outermost first."""
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def is_network_error(error: BaseException) -> bool:
    """True for failures to reach the server (as opposed to answers from it)."""
    return any(type(e).__name__ in _NETWORK for e in causes(error))


def server_answer(error: BaseException) -> tuple[str, str, int | None] | None:
    """``(code, message, HTTP status)`` of the first S3 answer in ``error``'s cause chain (a botocore
    ``ClientError``'s ``response``, also behind an ``OSError`` that s3fs translated), else ``None``."""
    for cause in causes(error):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            details: dict[str, Any] = response["Error"]
            code = str(details.get("Code") or status or "")
            return code, " ".join(str(details.get("Message") or "").split()), status if isinstance(status, int) else None
    return None


def is_precondition_failure(error: BaseException) -> bool:
    """A conditional write (``If-None-Match``/``If-Match``) that the server refused: s3fs reports it
    as ``OSError(EINVAL)``; the answer it wraps carries 412 (or 409 when two conditional writes collide)."""
    answer = server_answer(error)
    if answer is not None and (answer[2] in (409, 412) or answer[0] in ("PreconditionFailed", "ConditionalRequestConflict")):
        return True
    return "pre-condition" in str(error) or "precondition" in str(error).lower()


def remote_error(error: BaseException, url: str) -> RemoteRepoError | None:
    """``error`` as the one-line :class:`RemoteRepoError` a user should see, or ``None`` when it is
    not a remote failure (a bug, or a local file's error: it keeps its own handling).

    Args:
        error: what an object-store call raised.
        url: the repo's URL, named in the message.

    Returns:
        The error to raise ``from error``, or ``None``.

    Example::

        remote_error(NoCredentialsError(), "s3://team/captures")
        # RemoteRepoError('no credentials for s3://team/captures: set AWS_ACCESS_KEY_ID and ...')
    """
    chain = list(causes(error))
    names = {type(e).__name__ for e in chain}
    if names & _NO_CREDENTIALS:
        return RemoteRepoError(f"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                               "or AWS_PROFILE (the usual AWS settings)")
    answer = server_answer(error)
    if answer is not None:
        code, message, _ = answer
        detail = f"{code}: {message}" if message else code
        if code == "NoSuchBucket":
            return RemoteRepoError(f"the bucket of {url} does not exist ({detail})")
        if code in _DENIED:
            return RemoteRepoError(f"permission denied by {url} ({detail}); check the credentials "
                                   "(AWS_PROFILE, AWS_ACCESS_KEY_ID) and what they may do in this bucket")
        if code in _THROTTLED:
            return RemoteRepoError(f"{url} is throttling requests ({detail}), still after retries; "
                                   "try again later (AWS_MAX_ATTEMPTS sets how often to retry)")
        return RemoteRepoError(f"{url} refused the request ({detail})")
    if names & _NETWORK:
        return RemoteRepoError(f"{url} is unreachable{_endpoint(chain)} ({_innermost(chain)})")
    botocore = next((e for e in chain if any(k.__name__ == "BotoCoreError" for k in type(e).__mro__)), None)
    if botocore is not None:  # a request botocore would not send: no region, an invalid bucket name...
        return RemoteRepoError(f"{url}: {' '.join(str(botocore).split())}")
    return None


def _endpoint(chain: list[BaseException]) -> str:
    """`` at http://host:port``: the endpoint botocore tried (its error names the object's whole URL)."""
    for cause in chain:
        kwargs = getattr(cause, "kwargs", None)
        endpoint = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
        if endpoint:
            parts = urlsplit(str(endpoint))
            return f" at {parts.scheme}://{parts.netloc}"
    return f" at {os.environ['AWS_ENDPOINT_URL']}" if os.environ.get("AWS_ENDPOINT_URL") else ""


def _innermost(chain: list[BaseException]) -> str:
    """The most specific reason in the chain (``Connect call failed ('127.0.0.1', 9)``)."""
    for cause in reversed(chain):
        text = " ".join(str(cause).split())
        if text:
            return text
    return type(chain[0]).__name__

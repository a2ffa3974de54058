"""Which NATS failures are worth trying again (docs/semantics/kv.md §4.4).

A JetStream cluster losing a node or electing a leader answers late, not at all,
or "not now" for a few seconds; the same request a moment later succeeds. Those
failures are transient. Anything else (the stream is gone, the request is refused,
the connection was closed for good) will fail the same way every time and must
end what tried it, loudly.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors

from waymark.kv.errors import KvConnectionError, Timeout

# JetStream API error codes a cluster answers with while it heals (nats-server's
# errors.json): 10008 "JetStream system temporarily unavailable" (503), 10009
# "JetStream cluster can not handle request" (no meta leader, 500), 10118 and 10194
# "stream is offline" (no stream leader yet, 500).
_HEALING = frozenset({10008, 10009, 10118, 10194})

_UNANSWERED = (
    Timeout,  # waymark.kv.deadline.timed: no answer in time (a dead or stopped server)
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,  # nothing serves the JetStream API right now
    nats.errors.StaleConnectionError,  # the connection is being replaced
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,  # the reconnect buffer is full
    KvConnectionError,  # a (re)connect that did not succeed yet
)


def transient(error: BaseException) -> bool:
    """Whether ``error`` may go away if the same NATS request is made again later.

    No answer in time, no responders (nats-py's JetStream raises a 503
    ``ServiceUnavailableError`` for it), a reconnecting client, and the cluster's
    healing codes are; a 404 (the stream or bucket is gone), a 400, a permission
    error, a closed connection are not.
    """
    if isinstance(error, _UNANSWERED):
        return True
    if isinstance(error, nats.js.errors.ServiceUnavailableError):
        return True
    if isinstance(error, nats.js.errors.APIError):
        return error.err_code in _HEALING
    return False

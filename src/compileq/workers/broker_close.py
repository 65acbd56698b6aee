"""A broker channel's close that finishes when the connection of its pending pop is dead.

kombu's Redis channel, closing, first reads the reply to the blocking pop it has in flight.
When the node is gone (a failover's SIGKILLed master, a Redis restart) that read fails and the
close stops there, the channel still open, while Celery's cleanup of the lost connection goes
on and detaches the channel's transport. Celery then closes the connection a second time; that
close gets further, restores the build the worker had in hand (acks late) through the detached
transport, and raises AttributeError, which Celery's cleanup, expecting connection errors only,
lets through: "Unrecoverable error", the worker exits and its supervisor restarts it, seconds
of start-up in the middle of a failover, and the builds in hand started again. It needs a build
in hand and the consumer popping for a free slot at the moment the node dies: about one run in
ten of CI's failover test; tests/test_sentinel.py makes that state on demand.

Here a close whose pending read fails carries on at once, in the same call, while its transport
is still attached: the rest runs as it does when no pop is pending (restoring the build in hand
fails on the dead node, a connection error Celery's cleanup ignores), and Celery reconnects to
the new master. The build goes on in its pool process; Celery drops its ack with the lost
connection, so its message waits in the unacked hash and is delivered again after the
visibility timeout, when it finds its artifact stored.

Rejected alternatives: catching the AttributeError in a subclass of Celery's consumer (it hides
the error instead of finishing the close, and would hide any other AttributeError of Celery's
reconnection path too); a kombu transport subclass for each URL form (redis, rediss, unix
socket, sentinel) to change one method; leaving it to the supervisor (a restart per failover).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from compileq.hooks.ledger import Patches

#: In the ledger with every other replacement compileq makes (for the worker's life).
_PATCHES = Patches("broker-close", "a broker lost under a pending pop may end the worker")


def install() -> None:
    """Make kombu's Redis channels (plain, TLS, unix socket, Sentinel) finish a close whose
    pending pop's read failed. Once per process; the worker's main process calls it before
    Celery connects."""
    from kombu.transport import redis as transport

    _PATCHES.wrap(transport.Channel, "close", _finishing)


def _finishing(original: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(original)
    def close(self: Any) -> None:
        try:
            original(self)
        except self.connection_errors:
            if self.closed:  # the error came from a close that ran through: nothing left
                raise
            # The pending pop's read failed, and cleared the pop: the rest of the close, now.
            original(self)

    return close

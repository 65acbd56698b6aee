"""FX queues that wait on this CPU's vector-ISA probes, joined after the worker takes work.

Which queue a CPU graph goes to names the vector ISAs Inductor finds usable here
(``fingerprint.fx_target``), and finding them compiles a probe per ISA: 15 to 18 s of a
25 s first start on a 2 x H200 node, and 0 s once the verdicts are cached (this machine's
Inductor cache, or Redis for a new machine of the same CPU). The kernel queues and a GPU's
own FX queue need none of it, so a worker takes their work as soon as Celery consumes, and
adds the CPU FX queues (CPU graphs, and GPU graphs with CPU tensors) once the probes are done.

The probes run on a thread of the worker's main process started after the pool forked (a
thread alive at a fork can leave its locks held in the child), and the queues are added on
Celery's event loop by polling from its timer: the consumer is not safe to touch from
another thread. Rejected alternative: Celery's ``add_consumer`` broadcast, which works from
anywhere but needs remote control through the broker for a worker to change its own queues.

Pool processes were forked before the verdicts were known: each finds the late toolchains
itself on its first such graph (``WorkerContext.fx_toolchain``), from the verdicts the main
process just cached, without probing again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from compileq._log import log
from compileq.fingerprint import FxToolchain

#: How often Celery's loop looks whether the probes are done; the delay a queue may join late.
POLL_S = 0.2


class LateFxQueues:
    def __init__(
        self,
        compute: Callable[[], dict[str, FxToolchain]],
        queue_for: Callable[[str, FxToolchain], str],
        joined: Callable[[dict[str, FxToolchain], list[str], float], None],
    ) -> None:
        self._compute, self._queue_for, self._joined = compute, queue_for, joined
        self._done = threading.Event()
        self._result: dict[str, FxToolchain] = {}
        self._error: BaseException | None = None
        self._started = 0.0
        self._entry: Any = None

    def start(self, consumer: Any) -> None:
        """From Celery's ``worker_ready`` (the event loop's thread; the pool has forked)."""
        self._started = time.monotonic()
        threading.Thread(target=self._run, name="compileq-isa-probes", daemon=True).start()
        self._entry = consumer.timer.call_repeatedly(POLL_S, self._poll, (consumer,))

    def _run(self) -> None:
        try:
            self._result = self._compute()
        except BaseException as e:  # the worker goes on serving what it already serves
            self._error = e
        finally:
            self._done.set()

    def _poll(self, consumer: Any) -> None:
        if not self._done.is_set():
            return
        self._entry.cancel()
        if self._error is not None:
            log.warning(
                "compileq worker: finding this CPU's vector ISAs failed (%s); it will not "
                "generate CPU graphs (clients compile them in process)",
                self._error,
            )
            # Joining none: the record stops saying they are pending, so no client waits.
            self._joined({}, [], time.monotonic() - self._started)
            return
        queues = [self._queue_for(target, tc) for target, tc in self._result.items()]
        for queue in queues:
            consumer.add_task_queue(queue)
        self._joined(self._result, queues, time.monotonic() - self._started)

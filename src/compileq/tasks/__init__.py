"""The wire: the Celery app (``tasks.app``), task and queue names, job specs. No task bodies:
those are the worker's (``workers/tasks.py``), and a client sends by name, so the wire imports
no worker code.

The package does not import the Celery app: a client that sends nothing never imports Celery
(``names.py`` says what that saves)."""

from compileq.tasks.jobs import TritonJob
from compileq.tasks.names import COMPILE_TRITON
from compileq.tasks.queues import triton_queue

__all__ = ["COMPILE_TRITON", "TritonJob", "triton_queue"]

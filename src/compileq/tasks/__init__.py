"""The wire: the Celery app, task and queue names, job specs. No task bodies: those are the
worker's (``workers/tasks.py``), and a client sends by name, so the wire imports no worker code."""

from compileq.tasks.app import COMPILE_TRITON, app
from compileq.tasks.jobs import TritonJob
from compileq.tasks.queues import triton_queue

__all__ = ["COMPILE_TRITON", "TritonJob", "app", "triton_queue"]

"""The wire: the Celery app, queue names, job specs and task signatures."""

from compileq.tasks.app import COMPILE_TRITON, app
from compileq.tasks.jobs import TritonJob
from compileq.tasks.queues import triton_queue

__all__ = ["COMPILE_TRITON", "TritonJob", "app", "triton_queue"]

"""The Celery application: JSON-only messages on Redis, settings tuned for long builds."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery import Celery

from compileq import keys
from compileq.config import Settings, get_settings
from compileq.connect import master_name, sentinel_options
from compileq.sentinel_url import is_sentinel, parse_sentinel_url
from compileq.tasks.names import COMPILE_CPP, COMPILE_FX, COMPILE_TRITON, TUNE_TRITON

__all__ = ["COMPILE_CPP", "COMPILE_FX", "COMPILE_TRITON", "TUNE_TRITON", "app", "client_app"]


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_connection_timeout": settings.connect_timeout_s,
        "broker_connection_retry_on_startup": True,
        # An error *reply* on the broker connection is retried as a lost connection is. In a
        # failover Redis answers a worker's blocking pop with one (``UNBLOCKED ... master ->
        # replica``, ``READONLY`` from a node just demoted) and Celery's default takes it for
        # unrecoverable: the worker shut down and its supervisor restarted it, 15 s of
        # start-up (seen in CI's failover test; tests/test_sentinel.py unblocks the pop with an
        # error to show it). A reply that stays an error (an ACL refusing the queue) is logged
        # and retried for ever, as an unreachable broker is, rather than a restart loop.
        "broker_channel_error_retry": True,
        # Said outright (Celery warns while it is left unset): a build running when the broker
        # connection drops goes on and stores its artifact; its message, never acked, is
        # delivered again later and finds the entry stored. Cancelling it would throw the
        # build away and start it again.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        **_broker(settings),
        # Messages carry keys and small JSON only; artifacts travel through the store. pickle
        # is refused so that broker write access alone never means code execution on a worker.
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        # Completion is announced on compileq's own channel (the artifact is the result).
        "task_ignore_result": True,
        # A build is acked after it finishes, and requeued if its process dies, so a killed
        # worker loses nothing; prefetch 1 keeps one slow build from holding others hostage.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_soft_time_limit": settings.task_soft_time_limit_s,
        "task_time_limit": settings.task_time_limit_s,
        # A client must not block on a dead broker: a couple of quick tries, then local build.
        "task_publish_retry_policy": {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }


def kombu_url(url: str) -> str:
    """``url`` as kombu spells it: redis-py's ``unix:///PATH?db=N`` (a Redis on a unix socket,
    as the local cluster runs it) is kombu's ``redis+socket:///PATH?virtual_host=N``; any
    other URL is the same in both."""
    if not url.startswith("unix://"):
        return url
    parts = urlsplit(url)
    db = parse_qs(parts.query).get("db", ["0"])[0]
    return f"redis+socket://{parts.path}?virtual_host={db}"


def _broker(settings: Settings) -> dict[str, Any]:
    """The broker's URL and transport options; for Sentinel, kombu's sentinel transport.

    kombu's sentinel channel asks the Sentinels for the master on every new connection, so a
    worker whose broker connection died in a failover reconnects (Celery's connection retry)
    to the promoted replica. No result backend is configured (``task_ignore_result``), so
    there is no second connection needing the master's name.
    """
    options: dict[str, Any] = {
        "visibility_timeout": settings.visibility_timeout_s,
        "global_keyprefix": keys.BROKER,
        "socket_connect_timeout": settings.connect_timeout_s,
        # Without it kombu waits forever for the reply to a publish on a connection a
        # partition left half-open, and the client's deadline never gets to act. Above
        # kombu's 1 s BRPOP timeout, so idle workers are not disturbed.
        "socket_timeout": max(settings.connect_timeout_s, 5.0),
    }
    if not is_sentinel(settings.broker):
        return {"broker_url": kombu_url(settings.broker), "broker_transport_options": options}
    target = parse_sentinel_url(settings.broker)
    options["master_name"] = master_name(settings)
    options["sentinel_kwargs"] = sentinel_options(target, settings)
    config: dict[str, Any] = {"broker_url": target.kombu_url(), "broker_transport_options": options}
    if target.tls:
        # kombu takes TLS for the master from here (its sentinel URL has no TLS form) and
        # then connects with redis-py's SentinelManagedSSLConnection.
        config["broker_use_ssl"] = dict(target.tls)
    return config


#: The workers' app (``workers/tasks.py`` registers the tasks on it under the names above),
#: configured from the environment the supervisor sets. Read lazily: importing this module
#: must not freeze settings before flags are parsed.
app = Celery("compileq", set_as_current=False)
app.add_defaults(lambda: celery_config(get_settings()))


def client_app(settings: Settings) -> Celery:
    """An app that only sends, bound to ``settings`` (not the environment): a client given
    explicit settings must enqueue on the broker those settings name."""
    sender = Celery("compileq-client", set_as_current=False)
    sender.conf.update(celery_config(settings))
    return sender

"""The local cluster: compileq with no settings at all, one private cluster per user.

``compileq run -- python train.py`` with no ``COMPILEQ_REDIS_URL`` starts (or finds already
running) a redis-server on a unix socket in the user's cache dir, with a secret made once and
kept there, and a worker serving this machine's GPUs (or its CPU); the cluster stays up for
the next job and stops itself after ``COMPILEQ_LOCAL_IDLE_S`` without one, like sccache's
server. ``compileq stop`` ends it now; ``stats``, ``doctor``, ``explain`` and ``warm`` with no
settings talk to it.

- ``state.py``: where it lives, its secret, its record of processes, its two locks (stdlib
  only: ``compileq run`` reads them before every job and must stay quick).
- ``control.py``: find, start, join and stop it (what the CLI calls).
- ``daemon.py``: the process that owns redis-server and the worker, and stops them when idle.

The rejected alternatives: a redis-server per job (every job would start cold, and the second
run's hits are the point); a loopback TCP port (any user of the machine could connect; a
unix socket in a 0700 dir is its user's alone); a cluster left running for ever (a user who
tried compileq once would keep a Redis and a worker pool in memory).
"""

"""A compose health check: healthy once this container's worker has a live heartbeat.

The heartbeat (not the process) is what clients route by, so it is what "healthy" means.
"""

from __future__ import annotations

import socket
import sys

from compileq.cache.liveness import workers_info
from compileq.config import get_settings
from compileq.connect import redis_client


def main() -> int:
    settings = get_settings()
    host = socket.gethostname()
    live = [
        i for i in workers_info(redis_client(settings.redis_url, settings)) if i.get("host") == host
    ]
    return 0 if live else 1


if __name__ == "__main__":
    sys.exit(main())

"""Two network namespaces joined by a veth pair: a private link the tests can cut.

The addresses (a /30 in 10.213.7.0) exist only on the veth ends inside the namespaces made
here, so nothing a test sends can reach any other host or the machine's own interfaces.
Everything is removed on exit, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

SERVER_IP = "10.213.7.1"
CLIENT_IP = "10.213.7.2"


@dataclass(frozen=True)
class Link:
    server_ns: str  # holds redis-server and the worker
    client_ns: str  # holds the client
    server_if: str

    def server_argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.server_ns, *argv]

    def client_argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns, *argv]

    def cut(self) -> None:
        """Partition: the server's end goes down, so the client's packets vanish unanswered
        (a black hole, as with a dead switch), rather than being refused at once."""
        _ip("-n", self.server_ns, "link", "set", self.server_if, "down")

    def heal(self) -> None:
        _ip("-n", self.server_ns, "link", "set", self.server_if, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"network namespaces are required in CI: {reason}")
    pytest.skip(f"network namespaces unavailable here: {reason}")


@contextlib.contextmanager
def link() -> Iterator[Link]:
    if shutil.which("ip") is None:
        _unavailable("no `ip` command (apt-get install iproute2)")
    tag = str(os.getpid())[-6:]
    made = Link(f"cq-srv-{tag}", f"cq-cli-{tag}", f"cqs{tag}")
    client_if = f"cqc{tag}"
    probe = subprocess.run(
        ["ip", "netns", "add", made.server_ns], capture_output=True, text=True, timeout=10
    )
    if probe.returncode != 0:
        _unavailable(f"`ip netns add` failed: {probe.stderr.strip()} (needs root/CAP_SYS_ADMIN)")
    try:
        _ip("netns", "add", made.client_ns)
        _ip("link", "add", made.server_if, "type", "veth", "peer", "name", client_if)
        _ip("link", "set", made.server_if, "netns", made.server_ns)
        _ip("link", "set", client_if, "netns", made.client_ns)
        for ns, dev, addr in (
            (made.server_ns, made.server_if, SERVER_IP),
            (made.client_ns, client_if, CLIENT_IP),
        ):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield made
    finally:
        # Deleting a namespace destroys the veth end inside it, and with it its peer.
        for ns in (made.client_ns, made.server_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", made.server_if], capture_output=True, timeout=10)

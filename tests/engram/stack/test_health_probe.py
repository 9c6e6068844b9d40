"""The health probe used while `engram up` waits for its services (engram.stack.embedded.http_ok)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from engram.stack.embedded import http_ok


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback port that sends back what it reads: what a probe sees when it connects to itself
    (TCP simultaneous open on an ephemeral port nothing listens on yet)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                data = conn.recv(4096)
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_a_probe_reading_its_own_request_back_is_not_healthy_and_does_not_raise(echo_port: int) -> None:
    assert http_ok(f"http://127.0.0.1:{echo_port}/healthz") is False


def test_a_closed_port_is_not_healthy() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    assert http_ok(f"http://127.0.0.1:{port}/healthz") is False

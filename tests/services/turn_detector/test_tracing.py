"""Tracing: with ENGRAM_OTEL_ENDPOINT set, spans reach an OTLP/HTTP receiver and the trace
context of an incoming message travels on into the episode's headers (one turn, one trace)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import nats

from engram.settings import EngramSettings
from engram.schemas import SessionClosed, subjects
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import T0, msg, read_all, wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        _Collector.received.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


async def test_spans_are_exported_and_trace_context_reaches_the_episode(clean_nats: str, tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Collector.received.clear()
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=1,
                              otel_endpoint=f"http://127.0.0.1:{server.server_port}")
    service = td_app.build(settings)
    await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        traceparent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
        for i, (mid, role) in enumerate([("u1", "user"), ("a1", "assistant")]):
            m = msg("tr", mid, role, "hello", i)
            await js.publish(subjects.in_message("tr"), m.model_dump_json().encode(),
                             headers={subjects.HDR_MSG_ID: mid, "traceparent": traceparent})
        # the event that completes the turn (here the close) is the episode's parent span
        await js.publish(subjects.in_close("tr"), SessionClosed(session_id="tr", closed_at=T0).model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: "close-tr", "traceparent": traceparent})

        async def episode_msgs():  # noqa: ANN202
            return await read_all(js, subjects.STREAM_EPISODES)

        episodes = await wait_for(episode_msgs, 15)
        assert episodes, "no episode published"
        assert TRACE_ID in episodes[0].headers.get("traceparent", "")
    finally:
        await nc.close()
        await service.stop()  # flushes the span exporter
        server.shutdown()
    assert any(path == "/v1/traces" for path, _ in _Collector.received)
    assert any(bytes.fromhex(TRACE_ID) in body for _, body in _Collector.received)

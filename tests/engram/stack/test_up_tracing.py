"""`engram up` with ENGRAM_OTEL_ENDPOINT pointed at a local OTLP/HTTP receiver, and one turn
ingested with `engram ingest`: the receiver sees one trace with spans from every stage and the
LLM calls, and no span holds the turn's words; the services' /metrics show the freshness
histogram and the backlog gauges (issue 14, "Done when").

The receiver is a tiny HTTP server in the test that keeps every export request; requests are
decoded with opentelemetry-proto (a dependency of the OTLP exporter engram uses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.engram.cli.test_cli_up import ENGRAM, Up, _env

pytestmark = pytest.mark.slow

WORDS = ("quokka", "zanzibar", "reykjavik", "delightful")


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/traces":
            _Receiver.bodies.append(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _spans(bodies: list[bytes]) -> list[dict[str, Any]]:
    """Every exported span as {service, name, trace, attrs (all values as text)}."""
    out = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for span in ss.spans:
                    texts = [str(a.value).casefold() for a in span.attributes]
                    texts += [str(a.value).casefold() for e in span.events for a in e.attributes]
                    texts += [span.name.casefold(), span.status.message.casefold()]
                    out.append({"service": service, "name": span.name, "trace": span.trace_id.hex(),
                                "attrs": {a.key: a.value for a in span.attributes}, "texts": texts})
    return out


def _metrics(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:  # noqa: S310 - loopback
        lines = response.read().decode().splitlines()
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}


def test_engram_up_exports_one_trace_per_turn_to_an_otlp_receiver(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.bodies.clear()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    data = tmp_path / "engram"
    data.mkdir()
    transcript = tmp_path / "turn.jsonl"
    transcript.write_text("\n".join(json.dumps(row) for row in [
        {"session_id": "trace1", "role": "user", "content": "Ada adopted a quokka named Zanzibar in Reykjavik.",
         "timestamp": "2026-03-01T09:00:00Z"},
        {"session_id": "trace1", "role": "assistant", "content": "Zanzibar the quokka sounds delightful.",
         "timestamp": "2026-03-01T09:00:05Z"},
    ]) + "\n")
    up = Up(data, env={"ENGRAM_OTEL_ENDPOINT": endpoint})
    try:
        ingest = subprocess.run([*ENGRAM, "ingest", str(transcript), "--data-dir", str(data)], capture_output=True,
                                text=True, env={**_env(), "ENGRAM_OTEL_ENDPOINT": endpoint}, timeout=120)
        assert ingest.returncode == 0, ingest.stderr

        def stages_seen() -> set[str]:
            spans = _spans(list(_Receiver.bodies))
            turn = [s["trace"] for s in spans if s["name"] == "engram.ingest.turn"]
            return {s["service"] for s in spans if turn and s["trace"] == turn[0]}

        wanted = {"engram-ingest", "engram-turn-detector", "engram-extractor", "engram-summary-gate", "engram-sessions"}
        urls = {name: svc["url"] for name, svc in up.runtime["services"].items()}

        def summarised() -> bool:
            summary = _metrics(urls["summary-gate"])
            return summary.get('engram_pipeline_freshness_seconds_count{stage="summary"}', 0) >= 1

        # spans leave each service in batches (every ~5 s); generous for a loaded 2-core machine
        deadline = time.monotonic() + 150
        while not (wanted <= stages_seen() and summarised()) and time.monotonic() < deadline:
            time.sleep(0.5)
        # freshness and backlog, from the services' own /metrics (under engram up's NATS users)
        extractor = _metrics(urls["extractor"])
        assert extractor.get('engram_pipeline_freshness_seconds_count{stage="graph"}', 0) >= 1, extractor
        assert extractor.get('engram_stage_backlog_messages{partition="0",stage="extractor"}') == 0, extractor
        assert _metrics(urls["summary-gate"]).get('engram_pipeline_freshness_seconds_count{stage="summary"}', 0) >= 1
        assert 'engram_stage_backlog_messages{partition="0",stage="turn_detector"}' in _metrics(urls["turn-detector"])
        assert 'engram_stage_backlog_messages{partition="0",stage="sessions"}' in _metrics(urls["sessions"])
    finally:
        assert up.stop() == 0, up.log_tail()  # services flush their last spans on the way out
        server.shutdown()

    spans = _spans(list(_Receiver.bodies))
    turns = [s for s in spans if s["name"] == "engram.ingest.turn"]
    assert len(turns) == 1, [s["name"] for s in spans]
    in_turn = [s for s in spans if s["trace"] == turns[0]["trace"]]
    assert wanted <= {s["service"] for s in in_turn}, sorted({s["service"] for s in in_turn})
    calls = [s for s in in_turn if s["name"] == "engram.llm.call" and s["service"] == "engram-extractor"]
    assert calls and all(c["attrs"]["prompt.name"].string_value for c in calls)
    assert all(c["attrs"]["llm.tokens.input"].int_value > 0 for c in calls)
    assert any(s["name"] == "graphiti.llm.generate" for s in in_turn)
    for span in spans:
        leaked = [w for w in WORDS if any(w in t for t in span["texts"])]
        assert not leaked, f"{span['service']} {span['name']} holds {leaked}"
    assert os.environ.get("ENGRAM_OTEL_ENDPOINT") is None  # the test did not leak its endpoint

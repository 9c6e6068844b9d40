"""The summary gate's refresh call under the LLM simulator's faults (bench/llm_simulator.py): the
real turn-detector, extractor (rules model) and summary gate on real NATS + FalkorDB, the gate's
LLM being engram's OpenAI-compatible client talking HTTP to the simulator. A transient fault on
the refresh is retried inside the call and the node gets its summary; a server that stays down
dead-letters the delta with reason ``llm_unavailable`` after its deliveries (the shared
``retry_or_dead_letter`` tail), and nothing else stops: the other nodes' deltas are summarised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.llm_simulator import LLMSimulator, invalid_json, server_error
from engram.schemas import subjects
from engram.services.summary_gate.gate import GateSettings
from tests.services.summary_gate.helpers import group_of, new_session, pipeline
from tests.services.turn_detector.helpers import read_all, wait_for
from tests.support.llm import simulator_client


def gate_llm(sim: LLMSimulator) -> Any:
    return simulator_client(sim, timeout_s=2.0, max_retries=1)


async def test_a_transient_fault_on_the_refresh_still_summarises(sim: LLMSimulator, clean_nats: str,
                                                                  falkordb_server: Any, tmp_path: Path) -> None:
    session = new_session("sgfault")
    group = group_of(session)
    sim.schedule(server_error(503, prompt="EntitySummaries"), invalid_json(prompt="EntitySummaries"))
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=GateSettings(compose_max_facts=1),
                        gate_llm=gate_llm(sim)) as p:
        await p.say(session, "I work at Microsoft and I use pytest.")
        await p.close(session)
        await p.settle(60)
        assert sim.pending == 0 and sim.count("ok", prompt="EntitySummaries") == 1
        alice = [e for e in await p.events(group) if e.node_name == "Alice"]
        assert [(e.decision, e.reason, e.batch_size) for e in alice] == [("refreshed", "new_entity", 1)]
        assert (await p.node(group, "Alice"))["summary"]
        assert not await read_all(p.js, subjects.STREAM_DLQ, settle=0.1)


async def test_a_model_that_stays_down_dead_letters_the_delta_with_its_reason(
    sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    session = new_session("sgdown")
    group = group_of(session)
    sim.default = server_error(503)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=GateSettings(compose_max_facts=1),
                        gate_llm=gate_llm(sim)) as p:
        await p.say(session, "I work at Microsoft and I use pytest.")
        await p.close(session)

        async def letters() -> list | None:
            found = [m for m in await read_all(p.js, subjects.STREAM_DLQ, settle=0.05)
                     if m.headers.get(subjects.HDR_DLQ_STAGE) == "summary_gate"]
            return found if found and await p.quiet() else None

        found = await wait_for(letters, 60, 0.2)
        assert found and len(found) == 1, "the delta of the node that needs the LLM was not dead-lettered once"
        assert found[0].headers[subjects.HDR_DLQ_REASON] == "llm_unavailable"
        assert "InternalServerError (HTTP 503)" in found[0].headers[subjects.HDR_DLQ_DETAIL]
        # the nodes composed without the LLM were summarised all the same
        names = {e.node_name for e in await p.events(group)}
        assert {"Microsoft", "pytest"} <= names and "Alice" not in names

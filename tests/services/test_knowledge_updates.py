"""Knowledge updates through every door (issue 24, item 4): after a change, the current value comes
first in recall, the gateway's ``/search``, MCP ``search_memory_facts`` and the context builder
(``engram context``), and the old value, where shown, is marked. Real NATS JetStream and FalkorDB,
the services in-process (turn-detector, extractor with the offline rules model, recall, sessions,
the gateway and the MCP server on loopback sockets), driven as bench/knowledge_updates.py drives
them: the earlier statement in one chat, the later one a week on in another, one user scope per
pair.

The pairs: the trial's two (issue 24: the assistant restated the old value), and a change told a
week later but dated earlier ("Maya moved to Porto last month"): graphiti's date rule used to end
the *new* fact (dated before the Lisbon fact, which is dated when it was said), so every door gave
Lisbon first (services/extractor/told_later.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.knowledge_updates import DAY0, DOORS, TRIAL, WEEK, Case, serve, settings_for, tell_and_ask, user_of
from engram.graph.drivers import as_utc
from engram.schemas import subjects
from tests.services.recall.test_fact_changes import group_facts

BACKDATED = Case("backdated change", "tuning", "Maya lives in Lisbon.", "Maya moved to Porto last month.",
                 "Where does Maya live?", "Lisbon", "Porto")


@pytest.mark.slow
async def test_the_current_value_comes_first_through_every_door(
    clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    settings = settings_for(clean_nats, falkordb_server.url, tmp_path, group_prefix=f"k{uuid.uuid4().hex[:8]}")
    cases = [*TRIAL, BACKDATED]
    async with serve(settings) as s:
        results = await tell_and_ask(s, cases, timeout=120)

        # The context door is held to ``first``: its session_summary layer chains the last sessions
        # (ENGRAM_SESSION_CONTEXT_SUMMARIES), and the earlier session's summary is shown under its
        # own dated heading, after the later one's, with no "superseded" mark (a summary says what
        # was said then). Its recall layer alone (ctx-recall) is held to ``marked`` like the rest.
        failures = {(r.case.name, door): (r.verdicts[door].why, r.shown[door].items)
                    for r in results for door in DOORS
                    if not (r.verdicts[door].first if door == "context" else r.verdicts[door].marked)}
        assert not failures, failures
        # every door answered with the new value somewhere, and none with an unmarked old one
        for r in results:
            for door in DOORS:
                assert any(r.case.new.casefold() in text.casefold() for text, _ in r.shown[door].items), (door, r)

        # the backdated change in the graph: Porto current (its own date kept), Lisbon ended when
        # the move was told
        rows = await group_facts(settings, subjects.user_group(settings.group_prefix, user_of(cases.index(BACKDATED))))
        lisbon = [r for r in rows if "Lisbon" in r["fact"]]
        porto = [r for r in rows if "Porto" in r["fact"]]
        assert lisbon and porto, rows
        assert all(r["invalid_at"] is None and r["expired_at"] is None for r in porto), rows
        assert all(as_utc(r["valid_at"]) < DAY0 for r in porto), rows  # "last month": before the Lisbon fact
        assert all(as_utc(r["invalid_at"]) == DAY0 + WEEK and r["expired_at"] is not None for r in lisbon), rows

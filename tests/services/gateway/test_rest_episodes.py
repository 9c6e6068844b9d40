"""Whole text and JSON episodes through REST (issue 26, item 3: Graphiti's EpisodeType text and
json; ``POST /episodes``, services/gateway/routes.py and mapping.text_episode): extracted like a
turn, the same episode twice stored once, a JSON array chunked between its elements, a body
that is not JSON refused with a clear 422. Real NATS and FalkorDB, the pipeline in-process
(offline rules model)."""

from __future__ import annotations

import json

from engram.graph.drivers import GraphDrivers, query_rows
from tests.services.gateway.test_gateway import pipeline, serve_gateway, settings_for
from tests.services.turn_detector.helpers import wait_for

GROUP = "rest-episodes-1"


async def _entities(settings) -> set[str]:  # noqa: ANN001
    graph = GraphDrivers(settings)
    try:
        if not await graph.exists(GROUP):
            return set()
        return {r["name"] for r in await query_rows(await graph.driver(GROUP), "MATCH (n:Entity) RETURN n.name AS name")}
    finally:
        await graph.close()


async def test_text_and_json_episodes_are_extracted_once(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    text = {"group_id": GROUP, "name": "design note", "episode_body": "user (Ada): The billing service uses Postgres 15.",
            "reference_time": "2026-09-01T10:00:00Z", "saga": "design-notes"}
    records = [{"person": "Grace", "team": "payments", "note": f"Grace reviewed the Kafka consumer {i}."} for i in range(40)]
    doc = {"group_id": GROUP, "name": "review log", "source": "json", "episode_body": json.dumps(records)}
    async with pipeline(settings), serve_gateway(settings) as http:
        r = await http.post("/episodes", json=text)
        assert r.status_code == 202, r.text
        first = r.json()
        assert first["stored"] is True and first["turn_id"].startswith("rest:")
        again = (await http.post("/episodes", json=text)).json()
        assert again == {**first, "stored": False}  # the same episode twice: stored once
        r = await http.post("/episodes", json=doc)
        assert r.status_code == 202, r.text
        json_episode = r.json()["episode_uuid"]

        async def extracted() -> list[dict] | None:
            episodes = (await http.get(f"/episodes/{GROUP}", params={"last_n": 10})).json()
            return episodes if len(episodes) == 2 else None

        # both extracted (an Episodic node is written last); the offline rules model reads
        # "role (name): text" lines, so the JSON records give it nothing: a real model extracts them
        episodes = await wait_for(extracted, 60, interval=0.3)
        assert episodes and {e["uuid"] for e in episodes} == {first["episode_uuid"], json_episode}
        assert "Postgres" in await _entities(settings), await _entities(settings)
        described = {e["uuid"]: e["source_description"] for e in episodes}
        assert "saga design-notes" in described[first["episode_uuid"]]

        bad = await http.post("/episodes", json={**doc, "episode_body": "{not json"})
        assert bad.status_code == 422 and "not JSON" in bad.text
        assert (await http.post("/episodes", json={**text, "source": "message"})).status_code == 422

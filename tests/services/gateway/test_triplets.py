"""Memory without an LLM pass (issue 26, item 3; engram/publishing/triplets.py): POST /triplets stores a
fact given whole, resolved like an extracted one -- the same triplet twice is stored once, a
triplet naming a known entity joins it, a contradicting later one ends the older fact -- and no
extraction call is made. Real NATS and FalkorDB, the pipeline in-process (offline rules model)."""

from __future__ import annotations

from engram.graph.drivers import GraphDrivers, query_rows
from engram.publishing.triplets import triplet_episode
from engram.schemas import TripletFact
from engram.services.extractor.scrub import scrubbed_episode
from tests.services.gateway.test_gateway import pipeline, serve_gateway, settings_for
from tests.services.turn_detector.helpers import wait_for

GROUP = "triplets-1"


async def _facts(settings, group: str = GROUP) -> list[dict]:  # noqa: ANN001
    graph = GraphDrivers(settings)
    try:
        return await query_rows(await graph.driver(group),
                                "MATCH (a:Entity)-[e:RELATES_TO]->(b:Entity) RETURN a.name AS source, e.name AS name, "
                                "b.name AS target, e.fact AS fact, e.invalid_at AS invalid_at, e.expired_at AS expired_at")
    finally:
        await graph.close()


async def _entities(settings) -> list[str]:  # noqa: ANN001
    graph = GraphDrivers(settings)
    try:
        return sorted(r["name"] for r in await query_rows(await graph.driver(GROUP), "MATCH (n:Entity) RETURN n.name AS name"))
    finally:
        await graph.close()


async def test_a_triplet_is_stored_once_resolved_like_an_extracted_fact(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    body = {"group_id": GROUP, "source_node_name": "billing service", "edge_name": "USES", "target_node_name": "Postgres",
            "fact": "The billing service uses Postgres 15.", "valid_at": "2026-09-01T10:00:00Z"}
    async with pipeline(settings), serve_gateway(settings) as http:
        r = await http.post("/triplets", json=body)
        assert r.status_code == 202, r.text
        first = r.json()
        assert first["stored"] is True and first["group_id"] == GROUP
        again = (await http.post("/triplets", json=body)).json()
        assert again == {**first, "stored": False}  # the same triplet twice: stored once

        async def written() -> list[dict] | None:
            rows = await _facts(settings)
            return rows or None

        rows = await wait_for(written, 30, interval=0.2)
        assert [(r["source"], r["name"], r["target"], r["fact"]) for r in rows] == [
            ("billing service", "USES", "Postgres", "The billing service uses Postgres 15.")]
        r = await http.get(f"/episodes/{GROUP}", params={"last_n": 5})
        [episode] = r.json()
        assert episode["uuid"] == first["episode_uuid"] and episode["extraction"]["llm_calls"] == 0, episode

        # a later switch, given whole too, ends the older fact; the known entity is reused, not duplicated
        r = await http.post("/triplets", json={
            "group_id": GROUP, "source_node_name": "Billing service", "edge_name": "USES", "target_node_name": "SQLite",
            "fact": "We switched the billing service to SQLite.", "valid_at": "2026-10-01T10:00:00Z"})
        assert r.status_code == 202, r.text

        async def ended() -> list[dict] | None:
            rows = await _facts(settings)
            postgres = [x for x in rows if x["target"] == "Postgres"]
            return rows if len(rows) == 2 and postgres and postgres[0]["invalid_at"] is not None else None

        rows = await wait_for(ended, 30, interval=0.2)
        assert sorted(await _entities(settings)) == ["Postgres", "SQLite", "billing service"], await _entities(settings)
        assert str(next(x for x in rows if x["target"] == "Postgres")["invalid_at"]).startswith("2026-10-01")

        # bad input: a clear 422, nothing stored
        bad = await http.post("/triplets", json={**body, "source_node_name": "it"})
        assert bad.status_code == 422 and "source_node_name" in bad.text
        assert (await http.post("/triplets", json={**body, "edge_name": "uses; DROP"})).status_code == 422


def test_a_triplet_s_secrets_never_reach_the_graph() -> None:
    from datetime import datetime, timezone

    triplet = TripletFact(source="Ada", relation="USES", target="password=Sup3rSecretValue!",
                          fact="Ada logs in with password=Sup3rSecretValue! on staging.")
    episode = triplet_episode(GROUP, triplet, datetime(2026, 9, 1, tzinfo=timezone.utc))
    assert "Sup3rSecretValue" not in episode.model_dump_json()
    # and the extractor scrubs again whatever door published it
    raw = episode.model_copy(update={"triplet": triplet})
    assert "Sup3rSecretValue" not in scrubbed_episode(raw).model_dump_json(exclude={"content"})


async def test_a_triplet_over_nats_is_stored_like_one_over_rest(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """engram.triplet.add (served by the gateway), for agents that speak NATS: stored once, bad
    input answered with where it is wrong, never with the content."""
    import nats

    from engram.schemas import subjects
    from engram.schemas.messages import TripletAddRequest, TripletAddResponse

    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    triplet = TripletFact(source="billing service", relation="USES", target="Postgres",
                          fact="The billing service uses Postgres 15.")
    async with pipeline(settings), serve_gateway(settings):
        nc = await nats.connect(clean_nats)
        try:
            async def ask(body: bytes) -> TripletAddResponse:
                return TripletAddResponse.model_validate_json((await nc.request(subjects.TRIPLET_ADD, body, timeout=15)).data)

            request = TripletAddRequest(group_id=f"{GROUP}-nats", triplet=triplet).model_dump_json().encode()
            first = await ask(request)
            assert first.status == "ok" and first.stored and first.group_id == f"{GROUP}-nats", first
            assert (await ask(request)).model_copy(update={"stored": True}) == first  # again: stored once
            rows = await wait_for(lambda: _facts(settings, f"{GROUP}-nats"), 30, interval=0.2)
            assert [(r["source"], r["name"], r["target"]) for r in rows] == [("billing service", "USES", "Postgres")]

            bad = await ask(b'{"group_id": "g", "triplet": {"source": "it", "relation": "USES", "target": "x", '
                            b'"fact": "Zq private words"}}')
            assert bad.status == "error" and bad.reason.startswith("bad_request: triplet.source"), bad
            worse = await ask(b'{"group_id": "no spaces allowed", "triplet": {}}')
            assert worse.status == "error" and "group_id" in worse.reason and "Zq" not in worse.reason
        finally:
            await nc.close()

"""`engram doctor` against real NATS + FalkorDB: every check passes with the services running,
the smoke test goes message -> graph -> recall -> delete, and a missing part is reported."""

from __future__ import annotations

import nats

from engram.cli.doctor import run_checks
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings
from engram.schemas import subjects
from engram.schemas.messages import GraphEpisodesRequest, GraphEpisodesResponse
from engram.services.extractor import app as ex_app
from engram.services.recall import app as rc_app
from engram.services.turn_detector import app as td_app


async def test_doctor_with_smoke_passes_and_cleans_up(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, group_prefix="doc")
    apps = [td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient()), rc_app.build(settings)]
    for app in apps:
        await app.start()
    try:
        checks = {c.name: c for c in await run_checks(settings, smoke=True)}
        failed = {n: c.detail for n, c in checks.items() if c.status == "fail"}
        assert not failed, failed
        smoke = checks["smoke: message -> graph -> recall -> delete"]
        assert smoke.status == "ok" and "recall" in smoke.detail and "group deleted (ok)" in smoke.detail, smoke.detail
        assert checks["llm settings"].status == "warn"  # the offline rules extractor is named, not hidden
        # the temporary group is empty (on FalkorDB its graph is re-created empty, with its indices)
        nc = await nats.connect(clean_nats)
        try:
            client = await apps[2].recall.graph._client()  # type: ignore[attr-defined]
            temporary = [g for g in await client.list_graphs() if g.startswith("doc_doctor_")]
            assert len(temporary) <= 1
            for name in temporary:
                result = await client.select_graph(name).query("MATCH (n) RETURN count(n)")
                assert result.result_set[0][0] == 0
                reply = await nc.request(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=name).model_dump_json().encode())
                assert GraphEpisodesResponse.model_validate_json(reply.data).episodes == []
        finally:
            await nc.close()
    finally:
        for app in reversed(apps):
            await app.stop()


async def test_doctor_reports_a_missing_recall_service(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path)
    app = td_app.build(settings)  # creates the topology, but no recall service runs
    await app.start()
    try:
        checks = {c.name: c for c in await run_checks(settings)}
        assert checks["nats + jetstream"].status == "ok" and checks["topology"].status == "ok"
        assert checks["graph database"].status == "ok"
        assert checks["recall answers"].status == "fail" and "no recall service" in checks["recall answers"].detail
    finally:
        await app.stop()


async def test_doctor_without_nats_fails_fast(tmp_path) -> None:  # noqa: ANN001
    checks = await run_checks(EngramSettings(nats_url="nats://127.0.0.1:1", data_dir=tmp_path))
    assert [c.status for c in checks] == ["fail"] and checks[0].name == "nats + jetstream"

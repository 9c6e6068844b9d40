"""The memory explorer's server side (services/gateway/explorer.py) without a browser: what
invalidated a fact (pure), the page served without the key but every data route behind it, the
page's security headers, the page script rendering data as text only, the files shipped as
package data, and reading the summary-gate's log (also as the least-privilege gateway user). The page itself runs in Chromium in test_explorer_browser.py."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from datetime import datetime, timezone
from pathlib import Path

import nats
import nats.errors
import pytest

from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects
from engram.schemas.messages import GraphEpisode, GraphFact, SummaryAudit, SummaryEvent
from engram.graph.facts import infer_invalidated_by
from engram.services.gateway.explorer import PAGE_FILES, _parsed, facts_with_invalidators, newest_messages
from engram.services.gateway.settings import GatewaySettings
from tests.engram.runtime.test_nats_auth import _as, secured_nats  # noqa: F401 - the fixture
from tests.services.gateway.test_gateway import serve_gateway, settings_for

REPO = Path(__file__).resolve().parents[3]
PAGE_DIR = REPO / "services" / "gateway" / "explorer"
T1 = datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
T2 = datetime(2026, 3, 2, 9, tzinfo=timezone.utc)


def fact(uuid_: str, src: str, dst: str, episodes: list[str], *, valid_at: datetime = T1,
         invalid_at: datetime | None = None, expired_at: datetime | None = None) -> GraphFact:
    return GraphFact(uuid=uuid_, name="LIVES_IN", fact=f"{src} {uuid_} {dst}", group_id="g", source_node_uuid=src,
                     target_node_uuid=dst, episodes=episodes, valid_at=valid_at, invalid_at=invalid_at,
                     expired_at=expired_at, created_at=valid_at)


def episode(uuid_: str, at: datetime, edges: list[str]) -> GraphEpisode:
    return GraphEpisode(uuid=uuid_, name=uuid_, group_id="g", content="", source="message", valid_at=at,
                        entity_edges=edges)


def test_an_invalidated_fact_names_the_fact_and_episode_that_ended_it() -> None:
    boston = fact("boston", "ada", "city-b", ["e1"], invalid_at=T2, expired_at=T2)
    acme = fact("acme", "ada", "org-a", ["e1"])
    austin = fact("austin", "ada", "city-a", ["e2"], valid_at=T2)  # shares an endpoint, valid from the end
    likes = fact("likes", "ada", "tea", ["e2"], valid_at=T1)        # shares it too, but not from that instant
    touched = fact("touched", "ada", "org-a", ["e1"])               # listed by e2 but still current
    episodes = [episode("e2", T2, ["austin", "likes", "boston", "touched"]), episode("e1", T1, ["boston", "acme", "touched"])]
    out = {f.uuid: f for f in facts_with_invalidators(episodes, [boston, acme, austin, likes, touched])}
    assert (out["boston"].invalidated_by, out["boston"].invalidated_in) == ("austin", "e2")
    assert all(out[u].invalidated_by is None and out[u].invalidated_in is None for u in ("acme", "austin", "likes", "touched"))
    assert out["austin"].name == "LIVES_IN" and out["boston"].episodes == ["e1"]


def test_the_invalidator_prefers_the_same_endpoints_and_gives_up_when_ambiguous() -> None:
    old = fact("old", "ada", "b", ["e1"], invalid_at=T2)
    same_pair_reversed = fact("rev", "b", "ada", ["e2"], valid_at=T1)
    dated_shared = fact("shared", "ada", "c", ["e2"], valid_at=T2)
    assert infer_invalidated_by(old, [dated_shared, same_pair_reversed]) == "rev"
    assert infer_invalidated_by(old, [dated_shared]) == "shared"
    assert infer_invalidated_by(old, [dated_shared, fact("shared2", "b", "d", ["e2"], valid_at=T2)]) is None  # two candidates
    assert infer_invalidated_by(old, [fact("other", "x", "y", ["e2"], valid_at=T2)]) is None


async def test_the_page_needs_no_key_but_every_data_route_does(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    async with serve_gateway(settings, GatewaySettings(api_key="s3cret")) as http:
        page = await http.get("/explorer")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        for name, media in PAGE_FILES.items():
            r = await http.get(f"/explorer/{name}")
            assert r.status_code == 200 and r.headers["content-type"] == media, name
            assert r.content == (PAGE_DIR / name).read_bytes()
        assert (await http.get("/explorer/../app.py")).status_code == 404
        assert (await http.get("/explorer/explorer.py")).status_code == 404
        r = await http.get("/explorer/", follow_redirects=False)
        assert r.status_code == 308 and r.headers["location"] == "/explorer"
        for path in ("/groups", "/entities/g1", "/facts/g1", "/summary-log/g1"):
            assert (await http.get(path)).status_code == 401, path
            assert (await http.get(path, headers={"x-api-key": "wrong"})).status_code == 401, path
        # with the key: no recall service runs here, so the NATS request finds no responder (503)
        r = await http.get("/groups", headers={"x-api-key": "s3cret"})
        assert r.status_code == 503 and "recall" in r.json()["detail"]
        assert (await http.get("/facts/not a group", headers={"x-api-key": "s3cret"})).status_code == 422
        spec = (await http.get("/openapi.json")).json()
        assert {"/groups", "/entities/{group_id}", "/facts/{group_id}", "/summary-log/{group_id}"} <= set(spec["paths"])
        assert not [p for p in spec["paths"] if p.startswith("/explorer")], "the page is not part of the API"


def test_the_page_renders_data_as_text_only() -> None:
    """innerHTML & co. would turn stored content into markup; the script builds text nodes only,
    and search text goes in a POST body (the script never builds a URL from the query)."""
    script = (PAGE_DIR / "explorer.js").read_text()
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", script)
    assert 'api("POST", "search", { query' in script
    html = (PAGE_DIR / "explorer.html").read_text()
    assert "<script>" not in html and "style=" not in html and "onclick=" not in html  # the CSP allows no inline code


def test_the_page_is_package_data() -> None:
    """A non-editable install ships exactly the files the page router reads."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["engram.services.gateway"]
    files = [f"explorer/{p.name}" for p in PAGE_DIR.iterdir()]
    assert sorted(files) == sorted(["explorer/explorer.html", *(f"explorer/{n}" for n in PAGE_FILES)])
    assert all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in files), (files, patterns)


async def _publish_summary_log(js, n: int) -> list[SummaryEvent]:  # noqa: ANN001
    """``n`` decisions for group a and b each, interleaved, and one audit of a."""
    await ensure_topology(js, Topology.from_settings(EngramSettings()))
    events = []
    for i in range(n):
        for group in ("a", "b"):
            event = SummaryEvent(group_id=group, node_uuid=f"n{i}", node_name=f"node {i}", decision="skipped",
                                 reason="low_drift", drift=i / 100, decided_at=T1)
            await js.publish(subjects.summary(group), event.model_dump_json().encode(), stream=subjects.STREAM_SUMMARY)
            events.append(event)
    audit = SummaryAudit(group_id="a", node_uuid="n0", node_name="node 0", episode_id="e", reason="low_drift",
                         active_facts=["x"], kept_summary="s", decided_at=T1)
    await js.publish(subjects.summary_audit("a"), audit.model_dump_json().encode(), stream=subjects.STREAM_SUMMARY)
    return [e for e in events if e.group_id == "a"]


async def test_newest_messages_of_a_subject_newest_first(clean_nats) -> None:  # noqa: ANN001
    nc = await nats.connect(clean_nats)
    try:
        js = nc.jetstream()
        of_a = await _publish_summary_log(js, 30)
        newest, read = await newest_messages(js, subjects.STREAM_SUMMARY, subjects.summary("a"), 5)
        assert [SummaryEvent.model_validate_json(b).node_uuid for b in newest] == ["n29", "n28", "n27", "n26", "n25"]
        assert read == 30  # the other group's and the audit subject's messages are not read
        # a long log: only the newest scan_max messages of the stream are read, the newest still found
        newest, read = await newest_messages(js, subjects.STREAM_SUMMARY, subjects.summary("a"), 3, scan_max=10)
        assert [SummaryEvent.model_validate_json(b).node_uuid for b in newest] == ["n29", "n28", "n27"] and read <= 10
        assert (await newest_messages(js, subjects.STREAM_SUMMARY, subjects.summary("nobody"), 5)) == ([], 0)
        assert [e.node_uuid for e in _parsed(SummaryEvent, [b"{}", newest[0], b"not json"])] == ["n29"]
        assert len(of_a) == 30
        # nothing left behind: the ephemeral consumers are deleted
        assert (await js.stream_info(subjects.STREAM_SUMMARY)).state.consumer_count == 0
    finally:
        await nc.close()


async def test_the_gateway_user_may_read_the_summary_log_and_nothing_more(secured_nats) -> None:  # noqa: ANN001
    """Under least privilege (engram up, compose, k8s) the gateway's NATS user reads ENGRAM_SUMMARY
    through its own ephemeral consumers, and may not consume another stream that way."""
    proc, passwords = secured_nats
    admin = await _as(proc, passwords, "admin")
    gateway = await _as(proc, passwords, "gateway")
    try:
        await _publish_summary_log(admin.nc.jetstream(), 3)
        js = gateway.nc.jetstream(timeout=2.0)
        newest, _ = await newest_messages(js, subjects.STREAM_SUMMARY, subjects.summary_audit("a"), 5)
        assert [SummaryAudit.model_validate_json(b).node_name for b in newest] == ["node 0"]
        assert not gateway.errors, gateway.errors
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await newest_messages(js, subjects.STREAM_EPISODES, subjects.episode("a"), 5)
        assert any("$js.api.consumer.create.engram_episodes" in e.lower() for e in gateway.errors), gateway.errors
    finally:
        await gateway.nc.close()
        await admin.nc.close()


async def test_groups_are_named_by_their_scope_and_key(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """A workspace's and a user's group ids are hashes; the explorer names them by the key the
    extractor recorded in the group's own graph (EngramGroup), the session by its id."""
    from engram.schemas import ScopeKeys
    from tests.services.gateway.test_gateway import pipeline
    from tests.services.turn_detector.helpers import close, msg, publish, wait_for

    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    scopes = ScopeKeys(workspace="acme-repo", user="ada@example.org")
    async with pipeline(settings), serve_gateway(settings) as http:
        nc = await nats.connect(clean_nats)
        try:
            js = nc.jetstream()
            await publish(js, msg("named-s1", "m1", "user", "Ada uses FastAPI for billing.", 0, scopes=scopes))
            await publish(js, msg("named-s1", "m2", "assistant", "Noted.", 1, scopes=scopes))
            await close(js, "named-s1")
        finally:
            await nc.close()

        expected = {  # the graph server is shared with other tests: their groups are listed too
            subjects.session_group(settings.group_prefix, "named-s1"): "session named-s1",
            subjects.workspace_group(settings.group_prefix, "acme-repo"): "workspace acme-repo",
            subjects.user_group(settings.group_prefix, "ada@example.org"): "user ada@example.org",
        }

        async def named() -> dict | None:
            answer = (await http.get("/groups")).json()
            return answer if expected.items() <= answer["names"].items() else None

        answer = await wait_for(named, 60, interval=0.5)
        assert answer, f"the groups were not named in time: {(await http.get('/groups')).json()['names']}"
        assert "acme-repo" not in "".join(answer["group_ids"])  # the ids stay hashes

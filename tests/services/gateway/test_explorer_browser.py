"""The memory explorer in a real browser (issue 15 item 3): Debian's headless Chromium, driven by
Playwright, loads the gateway's /explorer page against a running engram -- real NATS JetStream
and FalkorDB, the pipeline in-process (turn-detector -> extractor with the offline rules model,
recall with graph admin) and the sessions service -- after a short conversation was ingested.
It connects with the API key, picks the group (episodes, entities, facts with what invalidated
them, the summary-gate's decisions and an audited skip, the user's preferences and notes), opens an
entity, searches, deletes a fact through the confirmation dialog and checks the fact is gone from
the page and from the graph, then deletes a note and a preference. Screenshots
(group view, an entity, search results) go to ``<pytest tmp>/explorer-screenshots`` (run with
``--basetemp DIR`` to keep them; docs/img/explorer.png is the search one).

Skipped only when /usr/bin/chromium is absent (``.ci/run`` installs it)."""

from __future__ import annotations

import contextlib
from urllib.parse import unquote
from datetime import datetime, timezone
import uuid
from pathlib import Path

import nats
import pytest
from falkordb import FalkorDB

from engram.models.rules_llm import RulesExtractorClient
from engram.schemas import SessionClosed, subjects
from engram.services.gateway.settings import GatewaySettings
from engram.services.sessions import app as sessions_app
from engram.services.summary_gate import app as sg_app
from engram.services.summary_gate.gate import GateSettings
from tests.services.gateway.test_gateway import pipeline, serve_gateway, settings_for
from tests.services.turn_detector.helpers import wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KEY = "explorer-test-key"
USER = "ada@example.org"
QUERY = "Where does Ada live?"
NOTE = "Ada prefers <b>short</b> answers <img src=x onerror=alert(1)>"
ROLE = "data <b>engineer</b>"  # a typed entity's attribute with markup: shown as text  # stored content with markup: shown as text

CONVERSATION = [  # three turns: the second invalidates the first's LIVES_IN fact
    ("user", "Ada", "I live in Boston. I work at Acme.", "2026-03-01T09:00:00Z"),
    ("assistant", "", "Noted.", "2026-03-01T09:00:05Z"),
    ("user", "Ada", "I moved to Austin.", "2026-03-02T09:00:00Z"),
    ("assistant", "", "Noted.", "2026-03-02T09:00:05Z"),
    ("user", "Ada", "I use FastAPI.", "2026-03-03T09:00:00Z"),  # a new fact of Ada's, no flip: skipped
    ("assistant", "", "Noted.", "2026-03-03T09:00:05Z"),
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                       "(apt-get install -y --no-install-recommends chromium; .ci/run installs it)"),
]


@contextlib.asynccontextmanager
async def sessions(settings):  # noqa: ANN001, ANN201
    """The sessions service: user memory requests and the close stage (session summaries)."""
    service = sessions_app.build(settings, llm=RulesExtractorClient())
    await service.start()
    try:
        yield
    finally:
        await service.stop()


@contextlib.asynccontextmanager
async def summary_gate(settings):  # noqa: ANN001, ANN201
    # every skip audited; drift never high enough to refresh on its own: a change that is not new
    # and flips no fact is skipped (and so audited)
    service = sg_app.build(settings, llm=RulesExtractorClient(), gate=GateSettings(audit_sample_rate=1.0, drift_threshold=2.0))
    await service.start()
    try:
        yield
    finally:
        await service.stop()


async def test_explorer_in_headless_chromium(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    from playwright.async_api import async_playwright, expect

    shots = tmp_path / "explorer-screenshots"
    shots.mkdir()
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    group = f"explorer-{uuid.uuid4().hex[:8]}"
    auth = {"x-api-key": KEY}
    async with pipeline(settings), summary_gate(settings), sessions(settings), \
            serve_gateway(settings, GatewaySettings(api_key=KEY, idle_timeout_s=1)) as http:
        messages = [{"role_type": r, "role": name, "content": text, "timestamp": ts} for r, name, text, ts in CONVERSATION]
        r = await http.post("/messages", json={"group_id": group, "messages": messages[:4]}, headers=auth)
        assert r.status_code == 202, r.text

        async def summarised() -> dict | None:  # the summary-gate writes Ada's summary after the deltas
            entities = (await http.get(f"/entities/{group}", headers=auth)).json()
            return next((e for e in entities if e["name"] == "Ada" and "Austin" in e["summary"]), None)

        # The third turn only once the second's refresh is done: the gate reads a node's facts when
        # it handles the delta, so a gate behind the extractor would summarise the third fact with
        # the second (and skip the third turn's delta as unchanged_hash, not low_drift).
        ada = await wait_for(summarised, 60, interval=0.5)
        assert ada, "the summary-gate did not summarise Ada in time"
        r = await http.post("/messages", json={"group_id": group, "messages": messages[4:]}, headers=auth)
        assert r.status_code == 202, r.text
        # the publisher ends the session (the gateway has no close route): its summary is stored
        nc = await nats.connect(clean_nats)
        try:
            closed_at = SessionClosed(session_id=group, closed_at=datetime(2026, 3, 3, 9, 1, tzinfo=timezone.utc))
            await nc.jetstream().publish(subjects.in_close(group), closed_at.model_dump_json().encode(),
                                         stream=subjects.STREAM_IN)
        finally:
            await nc.close()
        r = await http.put("/memory/preferences/city", params={"user": USER}, json={"value": "Austin"}, headers=auth)
        assert r.status_code == 200, r.text
        r = await http.post("/memory/notes", params={"user": USER}, json={"text": NOTE}, headers=auth)
        assert r.status_code == 201, r.text

        # Ada typed as an extraction with an ontology stores her (engram/graph/ontology.py): a label and
        # an attribute, shown in her entity view (as text: markup is not rendered)
        host, port = falkordb_server.url.split("://", 1)[1].rsplit(":", 1)
        typed = FalkorDB(host=host, port=int(port)).select_graph(group)
        typed.query("MATCH (n:Entity {name: 'Ada'}) SET n:Person, n.role = $role", {"role": ROLE})

        seen: list[dict] = []

        async def extracted() -> list[dict] | None:
            r = await http.get(f"/facts/{group}", headers=auth)
            assert r.status_code == 200, r.text
            facts = seen[:] = r.json()
            return facts if len(facts) >= 3 and any(f["invalidated_by"] for f in facts) else None

        facts = await wait_for(extracted, 120, interval=0.5)
        assert facts, f"the conversation was not extracted into facts (with one invalidated) in time: {seen}"
        invalidated = next(f for f in facts if f["invalidated_by"])
        assert "Boston" in invalidated["fact"] and invalidated["invalid_at"], invalidated

        async def audited() -> dict | None:  # the third turn's change to Ada is skipped, and audited
            log = (await http.get(f"/summary-log/{group}", headers=auth)).json()
            # the gate publishes a skip's audit, then its decision: wait for both
            skipped = any((d["node_name"], d["decision"]) == ("Ada", "skipped") for d in log["decisions"])
            return log if skipped and any(a["node_name"] == "Ada" for a in log["audits"]) else None

        async def closed() -> list | None:
            r = await http.get("/memory/sessions", params={"session": group}, headers=auth)
            return r.json() or None

        [record] = await wait_for(closed, 60, interval=0.5) or [None]
        assert record and record["summary"], "the closed session was not summarised in time"
        log = await wait_for(audited, 60, interval=0.5)
        assert log, "no audited skip of Ada's summary in time"
        decided = {(d["node_name"], d["decision"], d["reason"]) for d in log["decisions"]}
        assert {("Ada", "refreshed", "new_entity"), ("Ada", "refreshed", "polarity"), ("Ada", "skipped", "low_drift")} <= decided, \
            (sorted(decided), [(a["node_name"], a["reason"]) for a in log["audits"]])
        assert log["decisions"][0]["decided_at"] >= log["decisions"][-1]["decided_at"], "newest first"
        skip = next(a for a in log["audits"] if a["node_name"] == "Ada")
        assert skip["reason"] == "low_drift" and "Ada uses FastAPI." in skip["active_facts"], skip

        urls: list[str] = []
        async with async_playwright() as pw:
            browser = await pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1280, "height": 900})
            try:
                page = await browser.new_page()
                page.on("request", lambda request: urls.append(request.url))
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # a CSP violation (an inline style a library adds, say) is a console error, not a page error
                page.on("console", lambda msg: errors.append(msg.text)
                        if msg.type == "error" and "Content Security Policy" in msg.text else None)
                failed: list[tuple[int, str]] = []
                page.on("response", lambda resp: failed.append((resp.status, resp.url)) if resp.status >= 400 else None)
                await page.goto(f"{http.base_url}/explorer")

                # without the key the data calls are refused and the page says so
                await page.click("#connect button")
                await expect(page.locator("#status")).to_contain_text("API key")
                await page.fill("#api-key", KEY)
                await page.click("#connect button")
                await expect(page.locator(f"#group option[value='{group}']")).to_have_count(1)
                await page.select_option("#group", group)
                await page.click("#pick-group button")
                await expect(page.locator("#episodes li.episode")).to_have_count(3)
                # newest first, with the source messages
                await expect(page.locator("#episodes li.episode").first).to_contain_text("I use FastAPI.")
                await expect(page.locator("#facts li.fact.invalid")).to_contain_text(["Boston"])
                await expect(page.locator("#facts li.fact.invalid .invalidated-by")).to_contain_text(["Austin"])
                # the filter narrows the lists in the page
                listed = await page.locator("#facts > li").count()
                await page.fill("#filter", "boston")
                await expect(page.locator("#facts > li:visible")).to_have_count(1)
                await expect(page.locator("#facts > li:visible")).to_contain_text("Ada lives in Boston.")
                await expect(page.locator("#episodes > li:visible")).to_have_count(1)
                await page.fill("#filter", "")
                await expect(page.locator("#facts > li:visible")).to_have_count(listed)
                # the summary-gate's decisions and the audited skip, from ENGRAM_SUMMARY
                await expect(page.locator("#decisions li.decision").nth(len(log["decisions"]) - 1)).to_be_visible()
                await expect(page.locator("#decisions")).to_contain_text("Ada · polarity")
                await expect(page.locator("#audits li.audit").first).to_contain_text("Ada · skipped: low_drift")
                await expect(page.locator("#audits")).to_contain_text(skip["kept_summary"])
                # the session's summary (session scope), then the user's preferences and notes
                await page.select_option("#scope-kind", "session")
                await page.fill("#scope-key", group)
                await page.click("#pick-scope button")
                await expect(page.locator("#sessions .summary")).to_have_text([record["summary"]])
                await page.select_option("#scope-kind", "user")
                await page.fill("#scope-key", USER)
                await page.click("#pick-scope button")
                await expect(page.locator("#preferences")).to_contain_text("city: Austin")
                await expect(page.locator("#notes")).to_contain_text(NOTE)
                assert await page.locator("#notes b, #notes img").count() == 0, "a note's markup was rendered"
                await page.screenshot(path=shots / "group.png", full_page=True)

                # an entity with its summary and facts
                await page.click(f"#entities button:text-is('{ada['name']}')")
                await expect(page.locator("#entity-name")).to_have_text("Ada")
                await expect(page.locator("#entity-summary")).to_have_text(ada["summary"])
                await expect(page.locator("#entity-labels")).to_contain_text("Person")
                await expect(page.locator("#entity-attributes")).to_contain_text(f"role{ROLE}")
                assert await page.locator("#entity-attributes b").count() == 0, "an attribute's markup was rendered"
                await expect(page.locator("#entity-facts li.fact").first).to_be_visible()
                await page.locator("#entity-section").screenshot(path=shots / "entity.png")
                # her neighbourhood drawn as a graph (Cytoscape from the gateway): Boston's fact a
                # dashed edge with its dates, Austin's a current one
                await expect(page.locator("#entity-graph canvas").first).to_be_visible()
                drawn = await page.evaluate("""() => ({
                    nodes: graph.nodes().map((n) => n.data('label')),
                    superseded: graph.edges('.superseded').map((e) => [e.style('line-style'), e.data('label')]),
                    current: graph.edges('.current').map((e) => e.style('line-style')),
                })""")
                assert "Ada" in drawn["nodes"] and "Boston" in drawn["nodes"] and "Austin" in drawn["nodes"], drawn
                assert drawn["superseded"] and all(style == "dashed" and "→" in label
                                                   for style, label in drawn["superseded"]), drawn
                assert drawn["current"] and set(drawn["current"]) == {"solid"}, drawn
                await page.locator("#entity-graph").screenshot(path=shots / "entity-graph.png")
                # and how her facts changed: the Boston fact struck through, replaced by the Austin one
                boston = page.locator("#entity-timeline li.superseded", has_text="Boston")
                await expect(boston).to_contain_text("replaced by:")
                await expect(boston).to_contain_text("Austin")
                await page.locator("#entity-timeline").screenshot(path=shots / "entity-timeline.png")

                # search through recall; the query goes in the POST body, never into a URL
                await page.fill("#query", QUERY)
                await page.click("#search button")
                results = page.locator("#search-results li.fact")
                await expect(results.first).to_be_visible()
                await expect(page.locator("#search-results")).to_contain_text("Austin")
                await page.screenshot(path=shots / "search.png", full_page=True)
                found = await results.evaluate_all("items => items.map(li => [li.dataset.uuid, li.querySelector('.text').textContent])")
                target_uuid, target_fact = next((u, f) for u, f in found if "Austin" in f)

                # delete: Cancel keeps it, Delete removes it
                item = page.locator(f"#search-results li.fact[data-uuid='{target_uuid}']")
                await item.locator("button.delete").click()
                await expect(page.locator("#confirm")).to_be_visible()
                await expect(page.locator("#confirm-text")).to_contain_text(target_fact)
                await page.click("#confirm-cancel")
                assert (await http.get(f"/entity-edge/{target_uuid}", headers=auth)).status_code == 200
                await item.locator("button.delete").click()
                await page.click("#confirm-ok")
                await expect(page.locator(f"li.fact[data-uuid='{target_uuid}']")).to_have_count(0)
                await expect(page.locator("#status")).to_contain_text("Deleted the fact")

                # a note and a preference go the same way (user memory, the scope in the query)
                await page.click("#notes button.delete")
                await page.click("#confirm-ok")
                await expect(page.locator("#notes")).to_have_text("No notes.")
                await page.click("#preferences button.delete")
                await page.click("#confirm-ok")
                await expect(page.locator("#preferences")).to_have_text("No preferences.")
                assert not errors, errors  # no script error, no CSP violation thrown
                # the one refused call is the keyless connect (a browser's favicon probe aside)
                assert [s for s, u in failed if not u.endswith("/favicon.ico")] == [401], failed
            finally:
                await browser.close()

        assert (await http.get(f"/entity-edge/{target_uuid}", headers=auth)).status_code == 404
        r = await http.post("/search", json={"query": QUERY, "group_ids": [group]}, headers=auth)
        assert target_uuid not in {f["uuid"] for f in r.json()["facts"]}
        assert all(f["uuid"] != target_uuid for f in (await http.get(f"/facts/{group}", headers=auth)).json())
        memory = {"user": USER}
        assert (await http.get("/memory/notes", params=memory, headers=auth)).json() == []
        assert (await http.get("/memory/preferences", params=memory, headers=auth)).json() == []
        # the user key only in a query string, never a path ("ada" alone may occur inside a hex uuid)
        user_in_path = [u for u in urls if "example.org" in unquote(u.split("?")[0])]
        assert not [u for u in urls if "Austin" in u or "live" in u] and not user_in_path, urls

    for name in ("group.png", "entity.png", "search.png"):
        assert (shots / name).stat().st_size > 10_000, name


async def test_a_gateway_without_a_key_is_opened_without_asking_for_one(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """`engram up`'s gateway has no API key (loopback): the page says so and connects at once."""
    from playwright.async_api import async_playwright, expect

    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    group = f"keyless-{uuid.uuid4().hex[:8]}"
    async with pipeline(settings), serve_gateway(settings, GatewaySettings(idle_timeout_s=1)) as http:
        assert (await http.get("/explorer/auth.json")).json() == {"api_key_required": False}
        r = await http.post("/messages", json={"group_id": group, "messages": [
            {"role_type": "user", "role": "Ada", "content": "I use FastAPI."},
            {"role_type": "assistant", "role": "", "content": "Noted."}]})
        assert r.status_code == 202, r.text
        assert await wait_for(lambda: _has_group(http, group), 60, interval=0.5), "the group was not written in time"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                await page.goto(f"{http.base_url}/explorer")
                await expect(page.locator("#status")).to_contain_text("needs no API key")
                await expect(page.locator(f"#group option[value='{group}']")).to_have_count(1)
                assert await page.locator("#api-key").is_disabled()
            finally:
                await browser.close()


async def _has_group(http, group: str) -> bool:  # noqa: ANN001
    return group in (await http.get("/groups")).json()["group_ids"]

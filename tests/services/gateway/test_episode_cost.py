"""What one turn cost (issue 23 item 6), end to end: a turn POSTed to the gateway is extracted by a
running extractor (the offline rules model, real NATS JetStream and FalkorDB); ``GET /episodes``
then shows its LLM calls, tokens and stage times (``extraction``), the memory explorer's page turns
them into its line under the episode (its own script, run by Node.js: the non-browser check of
the page; test_explorer_browser.py needs Chromium), and a redelivery of the stored episode
neither zeroes nor changes them."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import nats
import pytest
from prometheus_client import REGISTRY

from engram.schemas import subjects
from tests.services.gateway.test_gateway import pipeline, serve_gateway, settings_for, turn
from tests.services.turn_detector.helpers import read_all, wait_for

SCRIPT = Path(__file__).resolve().parents[3] / "services" / "gateway" / "explorer" / "explorer.js"
NODE = shutil.which("node")


def cost_lines(episodes: list[dict]) -> list[str]:
    """The explorer page's cost line of each episode, from its own script (costLine in explorer.js)."""
    assert NODE, "needs Node.js"
    program = (
        "const vm = require('vm'); const fs = require('fs');\n"
        "globalThis.document = { addEventListener() {} };\n"  # the script only registers its page handlers
        f"vm.runInThisContext(fs.readFileSync({json.dumps(str(SCRIPT))}, 'utf8'));\n"
        "const episodes = JSON.parse(fs.readFileSync(0, 'utf8'));\n"
        "process.stdout.write(JSON.stringify(episodes.map(costLine)));\n"
    )
    done = subprocess.run([NODE, "-e", program], input=json.dumps(episodes), capture_output=True, text=True,
                          timeout=30, check=True)
    return json.loads(done.stdout)


def already_present() -> float:
    return REGISTRY.get_sample_value("engram_extractor_episodes_total", {"outcome": "already_present"}) or 0.0


def test_the_cost_line_reads_the_recorded_cost() -> None:
    if NODE is None:
        pytest.skip("needs Node.js")
    recorded = {"extraction": {"llm_calls": 3, "input_tokens": 1234, "output_tokens": 210,
                               "stage_ms": {"lookup": 1.2, "extract": 819.6, "resolve_nodes": 20.0, "total": 905.4}}}
    separate = {"extraction": {"llm_calls": 1, "input_tokens": 5, "output_tokens": 2,
                               "stage_ms": {"extract_nodes": 100.0, "extract_edges": 50.4}}}
    assert cost_lines([recorded, separate, {"extraction": None}]) == [
        "3 LLM calls · 1,234 in / 210 out tokens · extract 820 ms · total 905 ms",
        "1 LLM call · 5 in / 2 out tokens · extract 150 ms",
        "extraction cost not recorded",
    ]


@pytest.mark.slow
async def test_an_episode_shows_what_its_extraction_cost(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    group = f"cost-{uuid.uuid4().hex[:8]}"
    async with pipeline(settings), serve_gateway(settings) as http:
        assert (await http.post("/messages", json={"group_id": group, "messages": turn()})).status_code == 202

        async def recorded() -> list[dict] | None:
            r = await http.get(f"/episodes/{group}")
            assert r.status_code == 200, r.text
            return r.json() if r.json() and r.json()[0]["extraction"] else None

        (episode,) = await wait_for(recorded, 60, interval=0.25) or [None]
        assert episode is not None, "the episode was not stored with its cost"
        cost = episode["extraction"]
        assert cost["llm_calls"] > 0 and cost["input_tokens"] > 0 and cost["output_tokens"] > 0, cost
        assert cost["stage_ms"]["total"] > 0 and cost["stage_ms"]["extract"] >= 0, cost
        spec = (await http.get("/openapi.json")).json()["components"]["schemas"]
        assert "extraction" in spec["EpisodeResult"]["properties"] and "ExtractionCost" in spec

        if NODE is not None:  # the explorer's line under the episode, from the same answer
            (line,) = cost_lines([episode])
            calls = cost["llm_calls"]
            assert line.startswith(f"{calls} LLM call{'' if calls == 1 else 's'} · "
                                   f"{cost['input_tokens']:,} in / {cost['output_tokens']:,} out tokens · extract "), line

        # a redelivery of the stored episode (the extractor restarted before its ack): the same
        # body again under another Nats-Msg-Id, so JetStream delivers it a second time
        nc = await nats.connect(clean_nats)
        try:
            js = nc.jetstream()
            (stored,) = await read_all(js, subjects.STREAM_EPISODES)
            before = already_present()
            await js.publish(subjects.episode(group), stored.data, stream=subjects.STREAM_EPISODES,
                             headers={subjects.HDR_MSG_ID: f"{episode['uuid']}-redelivered"})
        finally:
            await nc.close()
        async def redelivered() -> bool:
            return already_present() > before

        assert await wait_for(redelivered, 30), "the episode was not processed again"
        (after,) = (await http.get(f"/episodes/{group}")).json()
        assert after["extraction"] == cost, "a redelivery must keep the recorded cost"

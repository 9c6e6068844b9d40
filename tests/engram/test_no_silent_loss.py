"""Issue 10, items 1 and 2, as a user meets them: dedupe ids that never collide across sessions,
scopes or deletes, secrets scrubbed on every path into storage, and a deleted group's text gone
from every file under the data dirs. Real nats-server and FalkorDB; the pipeline in-process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nats
import pytest

from engram.runtime.dlq import scrub_payload
from engram.stack.embedded import start_falkordb, start_nats
from engram.publishing.ingest import publish_events, read_jsonl
from engram.publishing.promote import Promotion, publish_promotion
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ChatMessage, Episode, ScopeKeys, subjects
from engram.schemas.messages import GraphDeleteResponse, GraphGroupDeleteRequest
from engram.services.summary_gate import app as sg_app
from engram.services.turn_detector import app as td_app
from tests.services.gateway.test_gateway import episodes_of, pipeline, serve_gateway
from tests.services.turn_detector.helpers import read_all, wait_for

ROOT = Path(__file__).resolve().parents[2]


# --- the id function ------------------------------------------------------------------------
def test_dedupe_id_is_a_function_of_session_scopes_id_and_epoch() -> None:
    ws = ScopeKeys(workspace="repo", user="ada")
    one = subjects.message_dedupe_id("s1", ws, "m1")
    assert one == subjects.message_dedupe_id("s1", ScopeKeys(workspace="repo", user="ada"), "m1")
    assert one == subjects.message_dedupe_id("s1", {"session": True, "workspace": "repo", "user": "ada"}, "m1")
    others = {
        subjects.message_dedupe_id("s2", ws, "m1"),  # another session
        subjects.message_dedupe_id("s1", ScopeKeys(workspace="other", user="ada"), "m1"),  # another workspace
        subjects.message_dedupe_id("s1", ws, "m2"),
        subjects.message_dedupe_id("s1", ws, "m1", epoch=1),  # after a delete
    }
    assert one not in others and len(others) == 4
    assert re.fullmatch(r"m-[0-9a-f]{40}", one)


def test_readme_documents_the_id_formula_exactly() -> None:
    import hashlib

    scopes = ScopeKeys(workspace="repo", user="ada")
    by_hand = "m-" + hashlib.sha256(json.dumps(
        ["s1", {"session": True, "user": "ada", "workspace": "repo"}, "m1", 0], separators=(",", ":")
    ).encode()).hexdigest()[:40]
    assert subjects.message_dedupe_id("s1", scopes, "m1") == by_hand


def test_dead_letters_and_promotions_are_scrubbed() -> None:
    raw = json.dumps({"content": "deploy with AKIAIOSFODNN7EXAMPLE and password=Sup3rSecretValue!"}).encode()
    scrubbed = scrub_payload(raw)
    assert b"AKIAIOSFODNN7EXAMPLE" not in scrubbed and b"Sup3rSecretValue" not in scrubbed
    assert json.loads(scrubbed)["content"].startswith("deploy with [REDACTED:")
    assert b"Sup3rSecretValue" not in scrub_payload(b"{not json password=Sup3rSecretValue!")
    from engram.publishing.promote import promotion_episode

    episode = promotion_episode(Promotion(kind="decision", text="Use db password=Sup3rSecretValue! for staging",
                                          key="repo", rationale="token ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
                                "engram")
    assert "Sup3rSecretValue" not in episode.content and "ghp_abcdef" not in episode.content


# --- the README example -----------------------------------------------------------------------
def _readme_publish_example() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- example: publish -->", 1)[1]
    return block.split("```python", 1)[1].split("```", 1)[0]


async def test_readme_example_run_twice_stores_both_sessions_once(clean_nats: str, tmp_path: Path) -> None:
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    await ensure_topology(js, Topology.from_settings(EngramSettings(nats_url=clean_nats, data_dir=tmp_path)))
    script = tmp_path / "publish.py"
    script.write_text(_readme_publish_example())
    env = {**os.environ, "ENGRAM_NATS_URL": clean_nats, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["s1", "stored", "s2", "stored"]
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert again.stdout.split() == ["s1", "already", "stored", "s2", "already", "stored"]
    stored = [ChatMessage.model_validate_json(m.data) for m in await read_all(js, subjects.STREAM_IN, "engram.in.*.message.*")]
    assert sorted(m.session_id for m in stored) == ["s1", "s2"]
    await nc.close()


# --- engram ingest ----------------------------------------------------------------------------
async def test_same_jsonl_into_two_workspaces_stores_both(clean_nats: str, tmp_path: Path) -> None:
    lines = [
        {"session_id": "chat-1", "message_id": "m1", "role": "user", "content": "We use Postgres for billing.",
         "timestamp": "2026-03-01T09:00:00Z"},
        {"session_id": "chat-1", "message_id": "m2", "role": "assistant", "content": "Noted: Postgres.",
         "timestamp": "2026-03-01T09:00:05Z"},
        {"session_id": "chat-2", "message_id": "m1", "role": "user", "content": "Deploys go out on Fridays.",
         "timestamp": "2026-03-01T10:00:00Z"},
        {"session_id": "chat-2", "message_id": "m2", "role": "assistant", "content": "Fridays, got it.",
         "timestamp": "2026-03-01T10:00:05Z"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(idle_timeout_s=1))
    detector = td_app.build(settings)
    await detector.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        w1 = await publish_events(js, read_jsonl(path, ScopeKeys(workspace="w1")))
        assert (w1.messages, w1.duplicates) == (4, 0)  # chat-2's "m1" is not chat-1's "m1"
        again = await publish_events(js, read_jsonl(path, ScopeKeys(workspace="w1")))
        assert (again.messages, again.duplicates) == (0, 4)  # "published 0, already present 4"
        assert again.closes == 0  # the same closes, after the same messages
        w2 = await publish_events(js, read_jsonl(path, ScopeKeys(workspace="w2")))
        assert (w2.messages, w2.duplicates, w2.closes) == (4, 0, 2)  # closes flush w2's last turns too

        groups = {subjects.workspace_group("engram", "w1"), subjects.workspace_group("engram", "w2")}

        async def episodes() -> dict[str, int] | None:
            counts: dict[str, int] = {}
            for m in await read_all(js, subjects.STREAM_EPISODES):
                ep = Episode.model_validate_json(m.data)
                counts[ep.group_id] = counts.get(ep.group_id, 0) + 1
            return counts if all(counts.get(g) == 2 for g in groups) else None

        counts = await wait_for(episodes, 20)
        assert counts and all(counts[g] == 2 for g in groups), counts
        # each session's own group got its turns once, not once per ingest
        assert counts[subjects.session_group("engram", "chat-1")] == 1
    finally:
        await nc.close()
        await detector.stop()


# --- the gateway --------------------------------------------------------------------------------
@pytest.mark.slow
async def test_gateway_retry_is_idempotent_repeats_are_kept_and_repost_after_delete_is_stored(
    clean_nats: str, falkordb_server, tmp_path: Path  # noqa: ANN001
) -> None:
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(idle_timeout_s=1))
    group = f"retry-{uuid.uuid4().hex[:8]}"
    body = {"group_id": group, "messages": [
        {"role_type": "user", "role": "Ada", "content": "ok"},
        {"role_type": "user", "role": "Ada", "content": "ok"},  # said twice: both kept
        {"role_type": "assistant", "role": "", "content": "Fine, shipping the billing fix."},
    ]}
    async with pipeline(settings), serve_gateway(settings) as http:
        assert (await http.post("/messages", json=body)).status_code == 202
        assert (await http.post("/messages", json=body)).status_code == 202  # a client retry
        [episode] = await episodes_of(http, group, 1)
        assert len(episode["message_ids"]) == 3
        await asyncio.sleep(1.5)  # idle timeout passed: a second turn would have been flushed by now
        assert len((await http.get(f"/episodes/{group}")).json()) == 1

        assert (await http.delete(f"/group/{group}")).status_code == 200
        assert (await http.get(f"/episodes/{group}")).json() == []
        assert (await http.post("/messages", json=body)).status_code == 202  # same content, after the delete
        [again] = await episodes_of(http, group, 1)
        assert len(again["message_ids"]) == 3 and again["uuid"] != episode["uuid"]


# --- nothing left on disk after a delete --------------------------------------------------------
UNIQUE = "Zyxwquartzfjord"
SECRETS = ["AKIAIOSFODNN7EXAMPLE", "Sup3rSecretValue9", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"]


def _files_containing(root: Path, needle: str) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.name.endswith(".ports"):
            try:
                if needle.encode() in path.read_bytes():
                    hits.append(str(path.relative_to(root)))
            except OSError:
                continue
    return hits


@pytest.mark.slow
async def test_deleted_groups_leave_no_text_and_secrets_never_rest(tmp_path: Path) -> None:
    nats_dir, falkor_dir = tmp_path / "nats", tmp_path / "falkordb"
    nats_proc, falkor_proc = start_nats(nats_dir), start_falkordb(falkor_dir)
    try:
        settings = EngramSettings(nats_url=nats_proc.url, graph_url=falkor_proc.url, data_dir=tmp_path / "run",
                                  partitions=2, turn=TurnDetectorSettings(idle_timeout_s=1, input_retention_s=0))
        summary_gate = sg_app.build(settings)
        gw_group = f"gw-{uuid.uuid4().hex[:8]}"
        session = "grep-session"
        scopes = ScopeKeys(workspace="acme")
        ws_group = subjects.workspace_group("engram", "acme")
        secret_text = (f"{UNIQUE} ships with key AKIAIOSFODNN7EXAMPLE and password=Sup3rSecretValue9 "
                       "and token ghp_abcdefghijklmnopqrstuvwxyz0123456789")
        async with pipeline(settings), serve_gateway(settings) as http:
            await summary_gate.start()
            nc = await nats.connect(nats_proc.url)
            js = nc.jetstream()
            try:
                # 1. chat messages over NATS, 2. the Graphiti REST API, 3. a promotion, 4. a dead letter
                t0 = datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
                for i, (role, text) in enumerate([("user", f"Tell {UNIQUE} about the rollout. {secret_text}"),
                                                  ("assistant", f"{UNIQUE} will roll out the Billing service."),
                                                  ("user", "Thanks.")]):
                    msg = ChatMessage(message_id=f"m{i}", session_id=session, role=role, content=text,
                                      timestamp=t0 + timedelta(seconds=i), scopes=scopes)
                    await js.publish(subjects.in_message(session), msg.model_dump_json().encode(),
                                     headers={subjects.HDR_MSG_ID: subjects.message_dedupe_id(session, scopes, msg.message_id)})
                r = await http.post("/messages", json={"group_id": gw_group, "messages": [
                    {"role_type": "user", "role": "Ada", "content": f"{UNIQUE} owns the Ledger service. {secret_text}"},
                    {"role_type": "assistant", "role": "", "content": f"Noted, {UNIQUE} owns Ledger."}]})
                assert r.status_code == 202
                await publish_promotion(js, Promotion(kind="decision", text=f"{UNIQUE} decides: {secret_text}",
                                                      key="acme"), "engram")
                await js.publish(subjects.in_message(session), f'{{"broken": "{secret_text}"'.encode())

                async def processed() -> bool:
                    eps = {Episode.model_validate_json(m.data).group_id for m in await read_all(js, subjects.STREAM_EPISODES)}
                    dead = await read_all(js, subjects.STREAM_DLQ)
                    return {ws_group, gw_group, subjects.session_group("engram", session)} <= eps and len(dead) == 1

                assert await wait_for(processed, 40)
                await episodes_of(http, gw_group, 1)
                await asyncio.sleep(2.0)  # extraction, summaries and input retention (0 s) settle

                # Secrets never rest anywhere, even before the delete (the raw input is erased once
                # processed; turns, promotions and dead letters are scrubbed).
                await nc.flush()
                for secret in SECRETS:
                    assert _files_containing(nats_dir, secret) == [], secret
                    assert _files_containing(falkor_dir, secret) == [], secret

                # The text is on disk before the delete (so the final check can fail).
                assert _files_containing(nats_dir, UNIQUE) and _files_containing(falkor_dir, UNIQUE)
                for group in (ws_group, gw_group, subjects.session_group("engram", session)):
                    reply = await nc.request(subjects.GRAPH_GROUP_DELETE,
                                             GraphGroupDeleteRequest(group_id=group).model_dump_json().encode(), timeout=60)
                    assert GraphDeleteResponse.model_validate_json(reply.data).status == "ok"
            finally:
                await nc.close()
                await summary_gate.stop()
    finally:
        nats_proc.stop()
        falkor_proc.stop()
    assert _files_containing(nats_dir, UNIQUE) == []
    assert _files_containing(falkor_dir, UNIQUE) == []


@pytest.mark.slow
async def test_deleting_an_episode_erases_its_stream_copies(clean_nats: str, falkordb_server, tmp_path: Path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(idle_timeout_s=1, input_retention_s=3600))
    group = f"ep-{uuid.uuid4().hex[:8]}"
    body = {"group_id": group, "messages": [
        {"role_type": "user", "role": "Ada", "content": "The ledger service runs on Postgres 16."},
        {"role_type": "assistant", "role": "", "content": "Noted, Postgres 16 for the ledger."},
        {"role_type": "user", "role": "Ada", "content": "And the billing service runs on SQLite."},
        {"role_type": "assistant", "role": "", "content": "Noted, SQLite for billing."},
    ]}
    async with pipeline(settings), serve_gateway(settings) as http:
        assert (await http.post("/messages", json=body)).status_code == 202
        episodes = await episodes_of(http, group, 2)
        doomed = episodes[0]
        nc = await nats.connect(clean_nats)
        js = nc.jetstream()
        try:
            def copies(msgs: list, key: str) -> int:
                return sum(1 for m in msgs if json.loads(m.data).get(key) == doomed["uuid"])

            assert copies(await read_all(js, subjects.STREAM_EPISODES), "episode_id") == 1
            inputs = [json.loads(m.data)["message_id"] for m in await read_all(js, subjects.STREAM_IN, "engram.in.*.message.*")]
            assert set(doomed["message_ids"]) <= set(inputs)  # retention 1 h: the raw input is still there
            assert (await http.delete(f"/episode/{doomed['uuid']}")).status_code == 200
            assert copies(await read_all(js, subjects.STREAM_EPISODES), "episode_id") == 0
            assert copies(await read_all(js, subjects.STREAM_DELTAS), "episode_id") == 0
            left = [json.loads(m.data)["message_id"] for m in await read_all(js, subjects.STREAM_IN, "engram.in.*.message.*")]
            assert not set(doomed["message_ids"]) & set(left) and len(left) == len(inputs) - len(doomed["message_ids"])
        finally:
            await nc.close()

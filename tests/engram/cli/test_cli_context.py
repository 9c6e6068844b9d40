"""`engram context` and `engram memory` (engram/cli/commands.py) against the sessions service's request side
on real NATS + FalkorDB: each layer printed with its tokens and budget, --json, degraded exits 1,
no scope is a usage error; notes and preferences saved and listed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from engram.graph.drivers import GraphDrivers
from engram.runtime.service import ServiceApp, make_broker
from engram.settings import EngramSettings
from engram.text.tokens import token_counter
from engram.schemas import subjects
from engram.services.sessions import requests
from engram.services.sessions.store import MemoryStore
from tests.engram.cli.test_cli_up import ENGRAM, _env


def _cli(nats_url: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ENGRAM, *args, "--data-dir", str(tmp_path)], capture_output=True, text=True,
                          env={**_env(), "ENGRAM_NATS_URL": nats_url, **(env or {})}, timeout=60)


@contextlib.asynccontextmanager
async def sessions_side(settings: EngramSettings) -> AsyncIterator[MemoryStore]:
    graphs = GraphDrivers(settings)
    store = MemoryStore(graphs)
    broker = make_broker(settings, service="sessions")
    requests.subscribe(broker, store, settings)
    app = ServiceApp(name="sessions", broker=broker)
    await app.start()
    try:
        yield store
    finally:
        await app.stop()
        await graphs.close()


async def test_engram_context_and_memory_commands(clean_nats: str, falkordb_server, tmp_path: Path) -> None:  # noqa: ANN001
    prefix = f"k{uuid.uuid4().hex[:8]}"
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, group_prefix=prefix)
    env = {"ENGRAM_GROUP_PREFIX": prefix}
    async with sessions_side(settings):
        run = lambda *args: asyncio.to_thread(_cli, clean_nats, tmp_path, *args, env=env)  # noqa: E731
        saved = await run("memory", "note", "--user", "ayse", "Django projesi üzerinde çalışıyor")
        assert saved.returncode == 0 and saved.stdout.startswith("saved note "), saved.stderr
        notes = await run("memory", "notes", "--user", "ayse", "--json")
        assert [n["text"] for n in json.loads(notes.stdout)] == ["Django projesi üzerinde çalışıyor"]
        await settings_preference(clean_nats, "ayse")
        prefs = await run("memory", "prefs", "--user", "ayse")
        assert prefs.returncode == 0 and "language" in prefs.stdout and "Türkçe" in prefs.stdout
        assert (await run("memory", "set", "--user", "ayse", "Theme", "dark")).stdout.strip() == "set theme"
        assert (await run("memory", "unset", "--user", "ayse", "theme")).stdout.strip() == "removed theme"
        again = await run("memory", "unset", "--user", "ayse", "theme")
        assert again.returncode == 1 and "no current value for 'theme'" in again.stderr
        history = json.loads((await run("memory", "prefs", "--user", "ayse", "--history", "--json")).stdout)
        assert [(p["key"], p["current"], p["ended_by"]) for p in history] == [
            ("language", True, None), ("theme", False, "removed")]

        out = await run("context", "--user", "ayse", "--identity", "Sen bir asistansın. " * 200)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        identity = next(x for x in lines if x.startswith("── identity: "))
        assert identity.startswith("── identity: ") and "/500 tokens, cut to fit (request)" in identity
        used = int(identity.removeprefix("── identity: ").split("/")[0])
        assert 0 < used <= 500
        assert any(x.startswith("── user_context: ") and "/1500 tokens (group " in x for x in lines)
        assert "- language: Türkçe" in out.stdout and "- Django projesi üzerinde çalışıyor" in out.stdout
        assert lines[-1].startswith("2 layers, ")

        as_json = json.loads((await run("context", "--user", "ayse", "--json")).stdout)
        count = token_counter()
        assert [s["layer"] for s in as_json["sections"]] == ["user_context"]
        assert all(count(s["text"]) == s["tokens"] <= s["budget"] for s in as_json["sections"])

        # a query with no recall service: the recall layer fails, the others are printed, exit 1
        degraded = await run("context", "--user", "ayse", "--query", "kedi", "--timeout-ms", "500")
        assert degraded.returncode == 1 and "── user_context: " in degraded.stdout
        assert [x for x in degraded.stderr.splitlines() if x.startswith("error: ")] == [
            "error: context degraded: recall: NoRespondersError (check the stack with `engram status`)"]

    usage = await asyncio.to_thread(_cli, clean_nats, tmp_path, "context")
    assert usage.returncode == 2 and "give at least one of --user" in usage.stderr
    no_service = await asyncio.to_thread(_cli, clean_nats, tmp_path, "context", "--user", "u")
    assert no_service.returncode == 1 and "no engram service answered" in no_service.stderr


async def test_engram_memory_activities_and_favorites(clean_nats: str, falkordb_server, tmp_path: Path) -> None:  # noqa: ANN001
    prefix = f"k{uuid.uuid4().hex[:8]}"
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, group_prefix=prefix)
    env = {"ENGRAM_GROUP_PREFIX": prefix}
    async with sessions_side(settings):
        run = lambda *args: asyncio.to_thread(_cli, clean_nats, tmp_path, *args, env=env)  # noqa: E731
        logged = await run("memory", "activity", "--user", "ada", "--kind", "search", "--id", "r1", "searched: Python tutorials")
        assert logged.returncode == 0 and logged.stdout.startswith("logged activity "), logged.stderr
        again = await run("memory", "activity", "--user", "ada", "--kind", "search", "--id", "r1", "searched: Python tutorials")
        assert again.stdout == logged.stdout  # the same id: logged once
        entries = json.loads((await run("memory", "activities", "--user", "ada", "--json")).stdout)
        assert [(a["kind"], a["text"]) for a in entries] == [("search", "searched: Python tutorials")]
        bad = await run("memory", "activity", "--user", "ada", "--kind", "Not A Kind", "x")
        assert bad.returncode == 2 and "--kind" in bad.stderr

        fav = await run("memory", "favorite", "--user", "ada", "--kind", "book", "Fluent Python")
        assert fav.returncode == 0 and fav.stdout.startswith("saved favorite "), fav.stderr
        listed = await run("memory", "favorites", "--user", "ada")
        assert "Fluent Python (book)" in listed.stdout and "1 favorites" in listed.stdout

        out = await run("context", "--user", "ada")
        assert "- Fluent Python (book)" in out.stdout and "search: searched: Python tutorials" in out.stdout

        favorite_uuid = fav.stdout.split()[-1]
        assert (await run("memory", "remove-favorite", "--user", "ada", favorite_uuid)).returncode == 0
        gone = await run("memory", "remove-favorite", "--user", "ada", favorite_uuid)
        assert gone.returncode == 1 and "no favorite" in gone.stderr
        assert (await run("memory", "remove-activity", "--user", "ada", entries[0]["uuid"])).returncode == 0
        assert json.loads((await run("memory", "activities", "--user", "ada", "--json")).stdout) == []


async def settings_preference(nats_url: str, user: str) -> None:
    """Set a preference over NATS as an agent's set_user_preference tool does."""
    import nats

    from engram.schemas.memory import MemoryResponse, MemoryScopes, SetUserPreferenceRequest

    nc = await nats.connect(nats_url)
    try:
        request = SetUserPreferenceRequest(scopes=MemoryScopes(user=user), key="language", value="Türkçe")
        reply = await nc.request(subjects.MEMORY_PREFERENCE_SET, request.model_dump_json().encode(), timeout=10)
        assert MemoryResponse.model_validate_json(reply.data).status == "ok"
    finally:
        await nc.close()

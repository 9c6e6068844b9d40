"""The thin client (issue 26, item 7): the engram-client wheel installs alone into a fresh venv
(pydantic and nats-py, no engram, no graphiti) and publishes to a real NATS with engram's streams,
with engram's dedupe ids, so a re-sent message is stored once."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import nats
import pytest

from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ScopeKeys, subjects
from tools.build_client import build

PUBLISH = """
import asyncio, json, sys
from datetime import datetime, timezone
from engram_client import Publisher
from engram.schemas import ChatMessage, ScopeKeys

async def main():
    publisher = await Publisher.connect(sys.argv[1])
    message = ChatMessage(message_id="m1", session_id="thin-1", role="user", content="Which DB do we use?",
                          timestamp=datetime.now(timezone.utc), scopes=ScopeKeys(workspace="repo", user="ada"))
    first, again = await publisher.message(message), await publisher.message(message)
    await publisher.close_session("thin-1", reason="done")
    await publisher.aclose()
    print(json.dumps({"first": first, "again": again}))

asyncio.run(main())
"""


@pytest.mark.slow
async def test_the_thin_client_installs_alone_and_publishes(clean_nats: str, tmp_path: Path) -> None:
    wheel = build(tmp_path / "dist")
    assert {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()} == {
        "schemas", "engram_client", "engram_client-0.1.0.dist-info"}
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=300)
    installed = {d["name"].lower() for d in json.loads(subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"], check=True, capture_output=True, text=True).stdout)}
    assert {"engram-client", "pydantic", "nats-py"} <= installed
    assert not installed & {"engram", "graphiti-core", "falkordb", "faststream", "neo4j"}, installed

    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    await ensure_topology(js, Topology.from_settings(EngramSettings()))
    try:
        out = subprocess.run([python, "-c", PUBLISH, clean_nats], check=True, capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)  # not the checkout: only the installed packages
        assert json.loads(out.stdout.strip().splitlines()[-1]) == {"first": True, "again": False}
        stored = await js.get_msg(subjects.STREAM_IN, seq=1)
        # stored partitioned (engram.in.<p>.message.<session>: the stream's subject transform)
        assert stored.subject.startswith("engram.in.") and stored.subject.endswith(".message.thin-1")
        assert stored.headers["Nats-Msg-Id"] == subjects.message_dedupe_id(
            "thin-1", ScopeKeys(workspace="repo", user="ada"), "m1")
        closed = await js.get_msg(subjects.STREAM_IN, seq=2)
        assert closed.subject.endswith(".close.thin-1")
        assert (await js.stream_info(subjects.STREAM_IN)).state.messages == 2  # the re-send was a duplicate
    finally:
        await nc.close()


def test_engram_s_own_wheel_carries_the_client_too() -> None:
    """Code written against engram_client runs where all of engram is installed."""
    import engram_client

    assert Path(engram_client.__file__).resolve().parent == Path(__file__).resolve().parents[2] / "engram_client"
    assert sys.modules["engram_client"].Publisher

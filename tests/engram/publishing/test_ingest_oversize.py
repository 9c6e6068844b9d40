"""`engram ingest` with messages larger than NATS's default max_payload (issue 23, item 5): a 2 MB
message is stored whole, one above engram's cap (ENGRAM_TURN_MAX_MESSAGE_BYTES) is named with its
line number and left out, and every other line of the file goes in (exit 3). Against a NATS
that kept nats-server's 1 MB default, the 2 MB message is named with the server's limit instead
of stopping the import. The CLI as a user runs it, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from engram.cli.commands import INGEST_SKIPPED_EXIT
from engram.stack.embedded import start_nats
from engram.settings import TurnDetectorSettings
from engram.schemas import subjects
from tests.engram.publishing.test_ingest_bad_lines import _ingest, _topology
from tests.services.turn_detector.helpers import read_all

CAP = TurnDetectorSettings().max_message_bytes
BIG = 2_000_000  # characters (ASCII: bytes too) of the 2 MB message: above 1 MB, within the 2 MiB cap


def _line(message_id: str, content: str, role: str = "user", session: str = "s1") -> str:
    return json.dumps({"session_id": session, "message_id": message_id, "role": role, "content": content,
                       "timestamp": f"2026-03-01T09:00:{len(message_id):02d}Z"})


def _big_text(n: int) -> str:
    # the middle is unique: a cut that keeps head and tail would lose it
    half = (n - len("MIDDLEWORD")) // 2
    return "a" * half + "MIDDLEWORD" + "b" * (n - half - len("MIDDLEWORD"))


def _transcript(tmp_path: Path) -> Path:
    lines = [
        _line("m1", "We deploy on Fridays."),                               # 1
        _line("m2", "Noted.", role="assistant"),                             # 2
        _line("m3", _big_text(BIG)),                                         # 3 a 2 MB paste
        _line("m4", "Got it.", role="assistant"),                            # 4
        _line("m5", _big_text(CAP + 1000)),                                  # 5 above the cap
        _line("m6", "And the staging cluster is in Oslo.", session="s2"),   # 6
        _line("m7", "Understood.", role="assistant", session="s2"),          # 7
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


async def _stored(nats_url: str) -> dict[str, str]:
    nc = await nats.connect(nats_url)
    try:
        msgs = await read_all(nc.jetstream(), subjects.STREAM_IN, "engram.in.*.message.*")
    finally:
        await nc.close()
    return {d["message_id"]: d["content"] for d in (json.loads(m.data) for m in msgs)}


async def test_a_2mb_message_is_stored_whole_and_one_above_the_cap_is_named(clean_nats: str, tmp_path: Path) -> None:
    await _topology(clean_nats)
    path = _transcript(tmp_path)
    out = await asyncio.to_thread(_ingest, path, clean_nats, tmp_path)
    assert out.returncode == INGEST_SKIPPED_EXIT, out.stdout[-2000:] + out.stderr[-2000:]
    skipped = [x for x in out.stderr.splitlines() if ": skipped: " in x]
    assert len(skipped) == 1 and skipped[0].startswith(f"{path}:5: skipped: "), out.stderr[-2000:]
    assert f"limit of {CAP} bytes (ENGRAM_TURN_MAX_MESSAGE_BYTES)" in skipped[0]
    assert "MIDDLEWORD" not in out.stderr and "aaaa" not in out.stderr  # the content is never echoed
    stored = await _stored(clean_nats)
    assert sorted(stored) == ["m1", "m2", "m3", "m4", "m6", "m7"]
    assert stored["m3"] == _big_text(BIG)  # whole: its length and its middle


@pytest.fixture
def default_payload_nats(tmp_path: Path):  # noqa: ANN201
    """A nats-server that kept the 1 MB max_payload default (a NATS not configured by engram)."""
    conf = tmp_path / "small.conf"
    conf.write_text("max_payload: 1MB\n")
    proc = start_nats(tmp_path / "small-nats", config=conf)
    yield proc.url
    proc.stop()


async def test_a_server_with_the_1mb_default_gets_every_line_but_the_2mb_one(default_payload_nats: str,
                                                                             tmp_path: Path) -> None:
    await _topology(default_payload_nats)
    path = _transcript(tmp_path)
    out = await asyncio.to_thread(_ingest, path, default_payload_nats, tmp_path)
    assert out.returncode == INGEST_SKIPPED_EXIT, out.stdout[-2000:] + out.stderr[-2000:]
    skipped = sorted(x for x in out.stderr.splitlines() if ": skipped: " in x)
    assert [x.split(": skipped: ")[0] for x in skipped] == [f"{path}:3", f"{path}:5"], out.stderr[-2000:]
    assert "max_payload of 1048576 bytes" in skipped[0]
    assert "publishing stopped" not in out.stderr
    assert sorted(await _stored(default_payload_nats)) == ["m1", "m2", "m4", "m6", "m7"]

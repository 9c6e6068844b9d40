"""`engram ingest` survives bad lines (issue 12, item 1): every valid line of a transcript is
imported, each invalid one is named with its line number and reason, the exit code says lines
were skipped; --strict refuses the whole file. Error text keeps its brackets (rich markup would
eat '[a-zA-Z0-9_-]'). The CLI as a user runs it, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import nats
import pytest

from engram.cli.commands import INGEST_SKIPPED_EXIT
from engram.publishing.ingest import SkippedLine, TranscriptError, read_jsonl
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ChatMessage, ScopeKeys, subjects
from tests.engram.cli.test_cli_up import ENGRAM, _env
from tests.services.turn_detector.helpers import read_all

GOOD = {"role": "user", "content": "We deploy on Fridays [not on Mondays].", "timestamp": "2026-03-01T09:00:00Z"}
LINES = [
    json.dumps({**GOOD, "session_id": "s1", "message_id": "m1"}),                    # 1 ok
    json.dumps({**GOOD, "session_id": "a.b", "message_id": "m2"}),                   # 2 bad session id
    "{this is not json",                                                             # 3 not JSON
    "",                                                                              # 4 blank: not a message, not an error
    json.dumps({**GOOD, "session_id": "s1", "message_id": "m3", "role": "wizard"}),  # 5 bad role
    json.dumps({"session_id": "s1", "message_id": "m4", "role": "user"}),            # 6 no content
    json.dumps(["a", "list"]),                                                       # 7 not an object
    json.dumps({**GOOD, "session_id": "s1", "message_id": "m5", "timestamp": "someday"}),  # 8 bad time
    json.dumps({**GOOD, "session_id": "s2", "message_id": "m6", "role": "assistant"}),  # 9 ok
]
BAD = {2: "session_id", 3: "not valid JSON", 5: "role", 6: "missing field 'content'", 7: "not a JSON object",
       8: "timestamp"}


def _transcript(tmp_path: Path) -> Path:
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(LINES) + "\n")
    return path


def test_reader_reports_each_bad_line_and_keeps_the_rest(tmp_path: Path) -> None:
    skipped: list[SkippedLine] = []
    events = list(read_jsonl(_transcript(tmp_path), ScopeKeys(), skipped=skipped))
    messages = [e for e in events if isinstance(e, ChatMessage)]
    assert [m.message_id for m in messages] == ["m1", "m6"]
    assert [s.lineno for s in skipped] == sorted(BAD)
    for line in skipped:
        assert BAD[line.lineno] in line.reason, line
    pattern = next(s for s in skipped if s.lineno == 2).reason
    assert "'^[a-zA-Z0-9_-]{1,128}$'" in pattern and "'a.b'" in pattern
    assert "Fridays" not in " ".join(s.reason for s in skipped)  # a reason never quotes the message text
    with pytest.raises(TranscriptError, match=r":2: session_id"):  # no list given: the first bad line raises
        list(read_jsonl(_transcript(tmp_path), ScopeKeys()))


def _ingest(path: Path, nats_url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**_env(), "ENGRAM_NATS_URL": nats_url, "ENGRAM_PARTITIONS": "2"}
    return subprocess.run([*ENGRAM, "ingest", str(path), "--data-dir", str(tmp_path), *extra],
                          capture_output=True, text=True, env=env, timeout=120)


async def _stored_messages(nats_url: str) -> list[str]:
    nc = await nats.connect(nats_url)
    try:
        msgs = await read_all(nc.jetstream(), subjects.STREAM_IN, "engram.in.*.message.*")
    finally:
        await nc.close()
    return sorted(json.loads(m.data)["message_id"] for m in msgs)


async def _topology(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        await ensure_topology(nc.jetstream(), Topology.from_settings(EngramSettings(nats_url=nats_url, partitions=2)))
    finally:
        await nc.close()


async def test_ingest_imports_the_valid_lines_and_names_the_bad_ones(clean_nats: str, tmp_path: Path) -> None:
    await _topology(clean_nats)
    path = _transcript(tmp_path)
    out = await asyncio.to_thread(_ingest, path, clean_nats, tmp_path)
    assert out.returncode == INGEST_SKIPPED_EXIT, out.stdout + out.stderr
    assert "published 2, already present 0 messages in 2 sessions" in out.stdout
    for lineno, reason in BAD.items():
        line = next((x for x in out.stderr.splitlines() if x.startswith(f"{path}:{lineno}: skipped: ")), None)
        assert line is not None and reason in line, out.stderr
    assert "'^[a-zA-Z0-9_-]{1,128}$'" in out.stderr  # brackets survive (not read as rich markup)
    assert "Traceback" not in out.stderr
    summary = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert len(summary) == 1 and "skipped 6 invalid lines" in summary[0] and "--strict" in summary[0]
    assert await _stored_messages(clean_nats) == ["m1", "m6"]


async def test_strict_refuses_the_whole_file(clean_nats: str, tmp_path: Path) -> None:
    await _topology(clean_nats)
    path = _transcript(tmp_path)
    out = await asyncio.to_thread(_ingest, path, clean_nats, tmp_path, "--strict")
    assert out.returncode == 2, out.stdout + out.stderr
    assert [x.split(": ")[0] for x in out.stderr.splitlines() if ": invalid: " in x] == [
        f"{path}:{n}" for n in sorted(BAD)]
    assert "nothing published (--strict)" in out.stderr
    assert await _stored_messages(clean_nats) == []


async def test_a_clean_file_exits_zero(clean_nats: str, tmp_path: Path) -> None:
    await _topology(clean_nats)
    path = tmp_path / "clean.jsonl"
    path.write_text(LINES[0] + "\n" + LINES[-1] + "\n")
    out = await asyncio.to_thread(_ingest, path, clean_nats, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "published 2, already present 0 messages in 2 sessions" in out.stdout
    assert out.stderr.count("error:") == 0


def test_a_file_of_only_bad_lines_publishes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(LINES[2] + "\n" + LINES[3] + "\n")
    out = subprocess.run([*ENGRAM, "ingest", str(path), "--data-dir", str(tmp_path)], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert out.returncode == 1
    assert "nothing to ingest" in out.stderr and f"{path}:1: skipped" in out.stderr

"""engram backup / engram restore (engram/cli/backup.py; issue 26, item 5) through the command line
against real `engram up` stacks: a running stack's streams and graph are backed up, restored
into a fresh data dir, and the restored stack gives the same recall answers, the same counts
and the same graph; a restore into a dir that holds memory, or from a directory that is no
backup, is refused with the reason."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.engram.cli.test_cli_up import Up, run, wait_idle

CHAT = [
    ("billing-1", "user", "The billing service uses Postgres 15.", "2026-09-01T10:00:00Z"),
    ("billing-1", "assistant", "Noted, billing is on Postgres 15.", "2026-09-01T10:00:05Z"),
    ("billing-2", "user", "We switched the billing service to SQLite.", "2026-10-01T10:00:00Z"),
    ("billing-2", "assistant", "Noted: billing now runs on SQLite.", "2026-10-01T10:00:05Z"),
    ("billing-2", "user", "Ada owns the billing service and she lives in Lisbon.", "2026-10-01T10:01:00Z"),
    ("billing-2", "assistant", "Got it.", "2026-10-01T10:01:05Z"),
]
QUESTION = "are we still on Postgres for billing?"


def _settled(data: Path, messages: int, timeout: float = 120) -> dict:
    """The status once every consumer of every stream is idle and the counts stop moving: the
    whole pipeline (turns, extraction, summaries, session closes) has done its work."""
    wait_idle(data, messages)
    deadline, last = time.monotonic() + timeout, None
    while True:
        status = json.loads(run("status", "--json", data_dir=data).stdout)
        idle = all(c["pending"] == 0 and c["ack_pending"] == 0
                   for stream in status["streams"].values() for c in (stream.get("consumers") or {}).values())
        if idle and status["counts"] == last:
            return status
        assert time.monotonic() < deadline, f"pipeline not settled: {status['counts']}"
        last = status["counts"] if idle else None
        time.sleep(1.0)


def _recall(data: Path) -> dict:
    answer = json.loads(run("recall", QUESTION, "--workspace", "acme", "--json", data_dir=data).stdout)
    return {"items": [(i["kind"], i["fact"], i["invalid_at"], i["uuid"]) for i in answer["items"]],
            "prompt": answer["prompt_section"]}


def _graph(data: Path, group: str) -> list[str]:
    lines = run("export", "--group", group, data_dir=data).stdout.splitlines()
    # the header holds the export's time; a property's place in its map is the store's business
    return sorted(json.dumps(json.loads(line), sort_keys=True) for line in lines[1:])


def test_backup_then_restore_into_a_fresh_dir_gives_the_same_memory(tmp_path: Path) -> None:
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"session_id": s, "role": r, "content": c, "timestamp": t,
                                        "workspace": "acme"}) + "\n" for s, r, c, t in CHAT))
    source, target, backup = tmp_path / "source", tmp_path / "target", tmp_path / "backup"
    up = Up(source)
    try:
        run("ingest", str(chat), "--workspace", "acme", data_dir=source)
        before = _settled(source, len(CHAT))
        run("memory", "note", "--user", "ada", "Prefers short answers", data_dir=source)
        recalled = _recall(source)
        assert recalled["items"], recalled
        out = run("backup", str(backup), data_dir=source)
        assert out.stdout.startswith("backed up ") and "groups to" in out.stdout, out.stdout
        manifest = json.loads((backup / "manifest.json").read_text())
        assert "ENGRAM_IN" in manifest["streams"] and manifest["groups"], manifest
        graphs = {g: _graph(source, g) for g in manifest["groups"]}
        again = run("backup", str(backup), data_dir=source, check=False)
        assert again.returncode == 1 and "not empty" in again.stderr
        busy = run("restore", str(backup), data_dir=source, check=False)  # its `engram up` is running
        assert busy.returncode == 1 and "stop it first" in busy.stderr, busy.stderr
    finally:
        assert up.stop() == 0

    refused = run("restore", str(tmp_path), data_dir=target, check=False)
    assert refused.returncode == 1 and "no engram backup" in refused.stderr
    restored = run("restore", str(backup), data_dir=target)
    assert restored.stdout.startswith("restored ") and f"{len(manifest['groups'])} groups" in restored.stdout
    twice = run("restore", str(backup), data_dir=target, check=False)
    assert twice.returncode == 1 and "fresh data dir" in twice.stderr  # a restore never merges two memories

    up = Up(target)
    try:
        after = _settled(target, len(CHAT))
        for key in ("turns", "episodes", "node_deltas", "dead_letters", "open_turns"):
            assert after["counts"][key] == before["counts"][key], (key, before["counts"], after["counts"])
        assert _recall(target) == recalled
        assert {g: _graph(target, g) for g in manifest["groups"]} == graphs
        notes = json.loads(run("memory", "notes", "--user", "ada", "--json", data_dir=target).stdout)
        assert [n["text"] for n in notes] == ["Prefers short answers"]
    finally:
        assert up.stop() == 0


def test_streams_are_snapshotted_upstream_first() -> None:
    """A stage publishes downstream before it acks upstream: ENGRAM_IN before the turn state before
    the episodes before the deltas (JetStream lists streams by name, which is not that order)."""
    from engram.cli.backup import snapshot_order

    listed = sorted(["ENGRAM_DELTAS", "ENGRAM_DLQ", "ENGRAM_EPISODES", "ENGRAM_IN", "ENGRAM_SCHED", "ENGRAM_SESSIONS",
                     "ENGRAM_SUMMARY", "KV_engram_turn_sessions", "KV_engram_session_epochs", "OTHER"])
    order = snapshot_order(listed)
    assert order.index("ENGRAM_IN") < order.index("KV_engram_turn_sessions") < order.index("ENGRAM_EPISODES") \
        < order.index("ENGRAM_DELTAS") < order.index("ENGRAM_SUMMARY")
    assert order.index("ENGRAM_IN") < order.index("ENGRAM_SESSIONS") and order[-1] == "OTHER"


async def test_a_backup_with_a_missing_or_strange_file_is_refused_before_anything_changes(tmp_path: Path) -> None:
    import pytest

    from engram.cli.backup import FORMAT, BackupError, restore
    from engram.settings import EngramSettings

    (tmp_path / "jetstream").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "streams": {"ENGRAM_IN": 1}}))

    class Untouched:  # no NATS call may be made before the files are checked
        def jetstream(self):  # noqa: ANN202
            raise AssertionError("the target was touched")

    with pytest.raises(BackupError, match="jetstream/ENGRAM_IN.json is missing"):
        await restore(EngramSettings(data_dir=tmp_path), Untouched(), tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "streams": {"../../etc": 1}}))
    with pytest.raises(BackupError, match="cannot read as a file"):
        await restore(EngramSettings(data_dir=tmp_path), Untouched(), tmp_path)

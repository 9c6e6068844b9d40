"""`engram up` / `status` / `ingest` / `dlq` as a user runs them: real processes, real servers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engram.stack.embedded import pid_alive
from engram.publishing.ingest import locomo_sessions
from engram.schemas import Episode
from tests.services.turn_detector.test_pairing import predicted_turns

pytestmark = pytest.mark.slow
ENGRAM = [sys.executable, "-m", "engram.cli"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env["GRAPHITI_TELEMETRY_ENABLED"] = "false"
    return env


def run(*args: str, data_dir: Path, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ENGRAM, *args, "--data-dir", str(data_dir)], capture_output=True, text=True, env=_env(),
        timeout=timeout, check=check,
    )


class Up:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.log = open(data_dir.parent / f"{data_dir.name}-up.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([*ENGRAM, "up", "--data-dir", str(data_dir)], stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**_env(), **(env or {})})
        deadline = time.monotonic() + 90
        while not self.runtime_file.exists():
            assert self.proc.poll() is None, f"engram up exited early:\n{self.log_tail()}"
            assert time.monotonic() < deadline, "engram up not ready in 90 s"
            time.sleep(0.1)
        self.runtime = json.loads(self.runtime_file.read_text())

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        path = self.data_dir.parent / f"{self.data_dir.name}-up.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def runtime_file(self) -> Path:
        return self.data_dir / "engram-runtime.json"

    def pids(self) -> list[int]:
        rt = json.loads(self.runtime_file.read_text()) if self.runtime_file.exists() else self.runtime
        return [rt["supervisor_pid"], *[p for p in rt["embedded"].values() if p],
                *[s["pid"] for s in rt["services"].values()]]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self.log.close()
        return code


def wait_idle(data_dir: Path, expect_messages: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads(run("status", "--json", data_dir=data_dir, check=False).stdout)
        consumers = status["streams"]["ENGRAM_IN"]["consumers"].values()
        idle = all(c["pending"] == 0 and c["ack_pending"] == 0 for c in consumers)
        if idle and status["counts"].get("messages") == expect_messages and status["counts"]["open_turns"] == 0:
            return status
        assert time.monotonic() < deadline, f"pipeline not idle: {status['counts']}"
        time.sleep(0.5)


def conv26_expectation(locomo_path: Path) -> tuple[int, int]:
    conv = next(c for c in json.loads(locomo_path.read_text()) if c["sample_id"] == "conv-26")
    speaker_a = conv["conversation"]["speaker_a"]
    turns = messages = 0
    for session in locomo_sessions(conv, "conv-26"):
        roles = ["user" if t["speaker"] == speaker_a else "assistant" for t in session.turns]
        turns += predicted_turns(roles)
        messages += len(roles)
    return messages, turns


def test_up_ingest_locomo_status_and_clean_stop(tmp_path: Path, locomo_path: Path) -> None:
    data = tmp_path / "engram"
    up = Up(data)
    try:
        status = json.loads(run("status", "--json", data_dir=data).stdout)
        assert status["ok"] and status["parts"]["falkordb"]["ok"] and status["services"]["turn-detector"]["ok"]
        out = run("ingest", str(locomo_path), "--format", "locomo", "--sample", "conv-26", "--workspace", "w",
                  data_dir=data)
        messages, turns = conv26_expectation(locomo_path)
        assert f"published {messages}, already present 0 messages in 19 sessions" in out.stdout
        status = wait_idle(data, messages)
        assert status["counts"]["turns"] == turns
        assert status["counts"]["episodes"] == 2 * turns  # session + workspace scope
        assert status["counts"]["dead_letters"] == 0
        again = run("ingest", str(locomo_path), "--format", "locomo", "--sample", "conv-26", "--workspace", "w",
                    data_dir=data)
        assert f"published 0, already present {messages} messages" in again.stdout
    finally:
        pids = up.pids()
        code = up.stop()
    assert code == 0
    time.sleep(0.5)
    assert [p for p in pids if pid_alive(p)] == []
    assert not (data / "engram-runtime.json").exists()


def test_sigkilled_supervisor_leaves_no_orphans(tmp_path: Path) -> None:
    up = Up(tmp_path / "engram")
    pids = up.pids()
    up.stop(signal.SIGKILL)
    deadline = time.monotonic() + 20
    while [p for p in pids if pid_alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in pids if pid_alive(p)] == []


def test_killing_the_turn_detector_mid_stream_loses_and_doubles_nothing(tmp_path: Path, locomo_path: Path) -> None:
    """SIGKILL the turn-detector repeatedly while a conversation streams in; the supervisor
    restarts it and redelivery completes the work: every message in exactly one turn."""
    data = tmp_path / "engram"
    up = Up(data)
    try:
        ingest = subprocess.Popen(
            [*ENGRAM, "ingest", str(locomo_path), "--format", "locomo", "--sample", "conv-26", "--data-dir", str(data)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
        )
        kills = 0
        for _ in range(3):
            time.sleep(0.4)
            pid = json.loads(up.runtime_file.read_text())["services"]["turn-detector"]["pid"]
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
                kills += 1
            # wait for the supervisor to bring it back
            deadline = time.monotonic() + 30
            while json.loads(up.runtime_file.read_text())["services"]["turn-detector"]["pid"] == pid:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert ingest.wait(120) == 0
        messages, turns = conv26_expectation(locomo_path)
        status = wait_idle(data, messages, timeout=120)
        assert kills >= 1
        assert status["counts"]["turns"] == turns
        nats_url = json.loads(up.runtime_file.read_text())["nats_url"]
        episodes = _read_episodes(nats_url, data)
        assert len(episodes) == turns
        seen = [m.message_id for e in episodes for m in e.messages]
        assert len(seen) == len(set(seen)) == messages  # every message exactly once
    finally:
        up.stop()


def _read_episodes(nats_url: str, data_dir: Path) -> list[Episode]:
    import asyncio

    import nats

    from tests.services.turn_detector.helpers import episodes

    async def go() -> list[Episode]:
        from engram.settings import EngramSettings  # the stack's admin user (engram up has NATS auth on)

        nc = await nats.connect(nats_url, **EngramSettings(data_dir=data_dir).nats_options())
        try:
            return await episodes(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(go())


def test_dlq_list_and_replay(tmp_path: Path) -> None:
    data = tmp_path / "engram"
    up = Up(data)
    try:
        import asyncio

        import nats

        async def send_bad() -> None:
            from engram.settings import EngramSettings  # the stack's admin user (engram up has NATS auth on)

            nc = await nats.connect(up.runtime["nats_url"], **EngramSettings(data_dir=data).nats_options())
            await nc.jetstream().publish("engram.in.message.s1", b"{oops", headers={"Nats-Msg-Id": "bad-1"})
            await nc.close()

        asyncio.run(send_bad())
        deadline = time.monotonic() + 20
        while True:
            rows = json.loads(run("dlq", "list", "--json", data_dir=data).stdout)
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert [(r["stage"], r["reason"], r["subject"]) for r in rows] == [
            ("turn_detector", "malformed_json", "engram.in.message.s1")
        ]
        assert "oops" not in json.dumps(rows)  # content never shown
        out = run("dlq", "replay", "--stage", "turn_detector", data_dir=data)
        assert "replayed 1" in out.stdout
        deadline = time.monotonic() + 20
        while True:  # the replayed bad message is dead-lettered again, as a new letter
            rows = json.loads(run("dlq", "list", "--json", data_dir=data).stdout)
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert len(rows) == 1 and rows[0]["reason"] == "malformed_json"
    finally:
        up.stop()


def test_up_honours_configured_ports(tmp_path: Path) -> None:
    import socket

    from engram.stack.embedded import free_port
    from engram.stack.supervisor import SERVICES

    def free_block(n: int, taken: set[int]) -> int:
        """A port p with p .. p+n-1 all free: the services take ENGRAM_HTTP_PORT and the next ones."""
        while True:
            base = free_port()
            block = range(base, base + n)
            if taken.isdisjoint(block) and all(_bindable(p) for p in block):
                return base

    def _bindable(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    nats_port, graph_port = free_port(), free_port()
    ports = {"ENGRAM_NATS_PORT": nats_port, "ENGRAM_GRAPH_PORT": graph_port,
             "ENGRAM_HTTP_PORT": free_block(len(SERVICES), {nats_port, graph_port})}
    up = Up(tmp_path / "engram", env={k: str(v) for k, v in ports.items()})
    try:
        rt = up.runtime
        assert rt["nats_url"] == f"nats://127.0.0.1:{ports['ENGRAM_NATS_PORT']}"
        assert rt["graph_url"] == f"falkor://127.0.0.1:{ports['ENGRAM_GRAPH_PORT']}"
        assert rt["services"]["turn-detector"]["url"] == f"http://127.0.0.1:{ports['ENGRAM_HTTP_PORT']}"
    finally:
        assert up.stop() == 0


def test_restart_backoff_resets_after_a_stable_run() -> None:
    """A crash loop backs off (2, 4, ... 30 s); a service killed after running a while comes back at
    once, however often that happened before (a chaos run kills each service ~5 times)."""
    from engram.stack.supervisor import STABLE_RUN_S, restart_delay

    delays, quick = [], 0
    for _ in range(6):
        delay, quick = restart_delay(1.0, quick)
        delays.append(delay)
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay(STABLE_RUN_S + 1, quick) == (0.0, 0)
    assert [restart_delay(STABLE_RUN_S + 1, 0)[0] for _ in range(5)] == [0.0] * 5


def test_a_data_dir_keeps_its_ports_across_restarts(tmp_path: Path) -> None:
    """An MCP host's config and an explorer bookmark survive `engram up` being restarted: the data
    dir's ports are reused when free (engram/stack/supervisor.py, ports.json), a taken one is replaced."""
    data = tmp_path / "engram"

    def urls(runtime: dict) -> dict[str, str]:
        return {"nats": runtime["nats_url"], "graph": runtime["graph_url"],
                **{name: svc["url"] for name, svc in runtime["services"].items()}}

    up = Up(data)
    first = urls(up.runtime)
    assert up.stop() == 0
    up = Up(data)
    try:
        assert urls(up.runtime) == first
    finally:
        assert up.stop() == 0
    # a port taken meanwhile by someone else: that part gets a new one, the others keep theirs
    taken = int(first["gateway"].rsplit(":", 1)[1])
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the last run's TIME_WAIT
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        up = Up(data)
        try:
            again = urls(up.runtime)
        finally:
            assert up.stop() == 0
    assert again["gateway"] != first["gateway"]
    assert {k: v for k, v in again.items() if k != "gateway"} == {k: v for k, v in first.items() if k != "gateway"}


def test_commands_find_the_running_stack_without_its_data_dir(tmp_path: Path) -> None:
    """`engram up --data-dir D` once; `engram status` and `engram recall` then find D on their own
    (engram/stack/last_stack.py), say so, and stop finding it once it stops."""
    data = tmp_path / "somewhere-else"
    env = {**_env(), "XDG_DATA_HOME": str(tmp_path / "xdg-data"), "XDG_STATE_HOME": str(tmp_path / "xdg-state")}

    def bare(*args: str) -> subprocess.CompletedProcess:  # no --data-dir
        return subprocess.run([*ENGRAM, *args], capture_output=True, text=True, env=env, timeout=60)

    up = Up(data, env={"XDG_STATE_HOME": env["XDG_STATE_HOME"]})
    try:
        status = bare("status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["ok"] and f"using the stack running in {data}" in status.stderr
        human = bare("status")  # each count says what it counts
        assert human.returncode == 0 and "raw input is erased" in " ".join(human.stdout.split()), human.stdout
        recalled = bare("recall", "anything", "--session", "no-such-session")
        assert "using the stack running in" in recalled.stderr, recalled.stderr
        # a scope with no memory at all (a mistyped key) is said, not answered "(no memory found)" with exit 0
        assert recalled.returncode == 1 and "no memory in session 'no-such-session'" in recalled.stderr
    finally:
        assert up.stop() == 0
    gone = bare("status")
    assert gone.returncode == 1 and "engram up" in gone.stderr and str(data) not in gone.stderr, gone.stderr


def test_a_killed_stack_is_not_found_by_the_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a SIGKILL the pointer and the runtime file stay behind; the data dir's lock does not,
    so the lookup gives nothing even if the pid lives on (here: this test's own pid)."""
    from engram.stack import last_stack

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    data = tmp_path / "dead"
    data.mkdir()
    (data / "engram-runtime.json").write_text("{}")
    last_stack.remember(data)  # records this (live) process's pid
    assert last_stack.running_data_dir() is None  # nobody holds the data dir's lock
    from engram.stack.datadir_lock import DataDirLock

    lock = DataDirLock(data)
    lock.acquire()
    try:
        assert last_stack.running_data_dir() == data
    finally:
        lock.release()
    last_stack.forget(data)
    assert not last_stack.pointer_file().exists()

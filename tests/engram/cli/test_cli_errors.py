"""Every `engram` command as a user runs it, against a stopped stack and with bad arguments: one
line that says what is wrong and what to do, a non-zero exit, and no traceback unless --debug
(issue 12, item 2). The commands are enumerated from the Typer app, so a command added later is
run here too, with arguments derived from its parameters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from engram.cli.commands import app
from engram.stack.embedded import free_port
from tests.engram.cli.test_cli_up import ENGRAM, _env

NOT_AGAINST_A_STOPPED_STACK = {
    ("up",): "starts a stack itself",
    ("demo",): "starts its own throw-away stack",
    ("restore",): "starts the data dir's own servers itself; a running stack is refused (tests/engram/cli/test_backup.py)",
}
NOT_AGAINST_A_KILLED_STACK = {
    ("serve",): "a service waits for NATS to come back (compose and Kubernetes start it before NATS)",
}
OPTIONS_TO_REACH_THE_STACK = {
    ("promote",): ["--workspace", "w"],
    ("recall",): ["--user", "u"],
    ("context",): ["--user", "u"],
    ("export",): ["--group", "g"],
    **{("memory", sub): ["--user", "u"] for sub in ("prefs", "set", "unset", "note", "notes", "activity", "activities",
                                                    "remove-activity", "favorite", "favorites", "remove-favorite")},
}
"""Options without which the command stops at its own argument check, before it needs the stack."""


def _command_tree() -> dict[tuple[str, ...], Any]:
    def walk(command: Any, path: tuple[str, ...]) -> dict[tuple[str, ...], Any]:
        subcommands = getattr(command, "commands", None)
        if not subcommands:
            return {path: command}
        return {p: c for name, sub in subcommands.items() for p, c in walk(sub, (*path, name)).items()}

    return walk(typer.main.get_command(app), ())


COMMANDS = _command_tree()


def test_every_command_is_enumerated() -> None:
    """A sanity check of the enumeration itself (it must not silently find nothing)."""
    assert {("status",), ("recall",), ("ingest",), ("promote",), ("doctor",), ("dlq", "list"), ("dlq", "replay"),
            ("serve",), ("up",), ("demo",)} <= set(COMMANDS)


def _valid_transcript(tmp: Path) -> Path:
    path = tmp / "one-message.jsonl"
    path.write_text(json.dumps({"session_id": "s1", "role": "user", "content": "hello"}) + "\n")
    return path


def _arguments(path: tuple[str, ...], tmp: Path) -> list[str]:
    """Values for a command's required arguments, from their types (a new command needs no entry here)."""
    values = []
    for param in COMMANDS[path].params:
        if param.param_type_name != "argument" or not param.required:
            continue
        kind = getattr(param.type, "name", "")
        if kind == "directory":
            values.append(str(tmp))
        elif kind in ("path", "file"):
            values.append(str(_valid_transcript(tmp)))
        elif kind == "choice":
            values.append(str(param.type.choices[0]))
        elif kind == "integer":
            values.append("1")
        else:
            values.append("hello")
    return values


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ENGRAM, *args], capture_output=True, text=True, env=_env(), timeout=timeout)


def assert_one_clear_line(out: subprocess.CompletedProcess, *must_say: str) -> str:
    said = out.stdout + out.stderr
    assert out.returncode != 0, said
    assert "Traceback" not in said and "╭" not in said, said  # no traceback, no rich error panel
    errors = [line for line in said.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, said
    for words in must_say:
        assert words in errors[0], errors[0]
    return errors[0]


def _killed_stack(tmp: Path) -> Path:
    """A data dir whose `engram up` was SIGKILLed: its runtime file names a dead supervisor and ports
    nothing listens on."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    data = tmp / "killed"
    data.mkdir()
    (data / "engram-runtime.json").write_text(json.dumps({
        "supervisor_pid": dead.pid, "nats_url": f"nats://127.0.0.1:{free_port()}",
        "graph_url": f"falkor://127.0.0.1:{free_port()}",
        "services": {"recall": {"url": f"http://127.0.0.1:{free_port()}", "pid": dead.pid}},
    }))
    return data


STOPPED = [(path, "no stack") for path in COMMANDS if path not in NOT_AGAINST_A_STOPPED_STACK] + [
    (path, "killed stack") for path in COMMANDS
    if path not in NOT_AGAINST_A_STOPPED_STACK and path not in NOT_AGAINST_A_KILLED_STACK]


@pytest.mark.parametrize(("path", "stack"), STOPPED, ids=[f"{' '.join(p)}-{s}" for p, s in STOPPED])
def test_every_command_against_a_stopped_stack(path: tuple[str, ...], stack: str, tmp_path: Path) -> None:
    if stack == "no stack":
        data = tmp_path / "never-started"
        data.mkdir()
    else:
        data = _killed_stack(tmp_path)
    args = [*path, *_arguments(path, tmp_path), *OPTIONS_TO_REACH_THE_STACK.get(path, []), "--data-dir", str(data)]
    line = assert_one_clear_line(run(*args), "engram up", str(data))
    if stack == "killed stack":
        assert "is not running" in line  # the runtime file's supervisor is gone: said, not just "cannot connect"


@pytest.mark.parametrize("path", list(COMMANDS), ids=[" ".join(p) for p in COMMANDS])
def test_every_command_with_an_unknown_option(path: tuple[str, ...], tmp_path: Path) -> None:
    out = run(*path, *_arguments(path, tmp_path), "--no-such-option")
    assert out.returncode == 2
    assert_one_clear_line(out, "--no-such-option", "--help")


BAD_ARGUMENTS = [
    # (arguments, what the one line must say)
    (["recall", "hi", "--session", "a.b"], ["--session", "'^[a-zA-Z0-9_-]{1,128}$'"]),
    (["recall", "hi", "--group", "bad group!"], ["--group", "not a group id"]),
    (["recall", "hi"], ["--session", "--workspace", "--user", "--group"]),
    (["recall", "hi", "--user", "u", "--max-facts", "0"], ["--max-facts"]),
    (["promote", "we use uv"], ["--workspace", "--user"]),
    (["promote", "we use uv", "--workspace", "w", "--kind", "rumour"], ["--kind", "decision"]),
    (["ingest", "/nonexistent.jsonl"], ["/nonexistent.jsonl", "does not exist"]),
    (["ingest", "{transcript}", "--format", "xml"], ["--format", "jsonl or locomo"]),
    (["ingest", "{transcript}", "--workspace", ""], ["--workspace"]),
    (["serve", "no-such-service"], ["no-such-service"]),
    (["up", "--data-dir", "{file}"], ["--data-dir", "is a file"]),
    (["demo", "--data-dir", "{not-the-demos}"], ["not created by `engram demo`"]),
    (["demo", "--locomo", "/nonexistent.json"], ["--locomo", "does not exist"]),
    (["dlq", "list", "--data-dir", "{file}"], ["--data-dir", "is a file"]),
]


@pytest.mark.parametrize(("args", "must_say"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments(args: list[str], must_say: list[str], tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    not_the_demos = tmp_path / "project"
    not_the_demos.mkdir()
    (not_the_demos / "notes.txt").write_text("mine")
    fill = {"{transcript}": str(_valid_transcript(tmp_path)), "{file}": str(a_file),
            "{not-the-demos}": str(not_the_demos)}
    out = run(*[fill.get(a, a) for a in args], *([] if "--data-dir" in args else ["--data-dir", str(tmp_path)]))
    assert out.returncode == 2, out.stdout + out.stderr
    assert_one_clear_line(out, *must_say)


def test_status_of_a_data_dir_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    out = run("status", "--data-dir", str(missing))
    assert out.stdout == ""  # no empty tables after the error
    assert_one_clear_line(out, f"no engram data directory at {missing}", "engram up")
    as_json = run("status", "--json", "--data-dir", str(missing))
    assert json.loads(as_json.stdout)["ok"] is False  # scripts still get their JSON
    assert_one_clear_line(as_json, str(missing))


def test_a_bad_setting_in_the_environment(tmp_path: Path) -> None:
    out = subprocess.run([*ENGRAM, "status", "--data-dir", str(tmp_path)], capture_output=True, text=True,
                         env={**_env(), "ENGRAM_PARTITIONS": "lots"}, timeout=60)
    assert_one_clear_line(out, "partitions", "ENGRAM_")


@pytest.mark.parametrize("where", ["after", "before"])
def test_debug_shows_the_traceback(where: str, tmp_path: Path) -> None:
    args = ["dlq", "list", "--data-dir", str(tmp_path)]
    out = run(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "CliError" in out.stderr, out.stderr

"""The README's code blocks, run as a user pastes them, against a stack this module starts.

Every fenced block of README.md is either run here or listed in ``NOT_RUN`` with the reason, so a
block added to the README fails ``test_every_readme_block_is_run_or_excused`` until someone
classifies it. The "Using it" block: each ``engram ...`` line runs (comment stripped, optional
``[...]`` groups left out and then all put in, every command given the module's data dir) against
one ``engram up`` and must exit 0; ``up`` and ``serve`` lines are excused in ``NOT_RUN_COMMANDS``.
The Python publishing example runs against the same stack, with the NATS URL read from
``engram status --json`` as the README says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt  # rich's own markdown parser, so no new dependency

from tests.engram.cli.test_cli_up import Up

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The console script `. .venv/bin/activate` puts on PATH: running it also proves the entry point.
ENGRAM = Path(sys.executable).parent / "engram"


@dataclass(frozen=True)
class Block:
    heading: str
    language: str
    first_line: str
    text: str


def readme_blocks() -> list[Block]:
    blocks, heading = [], ""
    tokens = MarkdownIt().parse(README.read_text())
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            heading = tokens[i + 1].content
        elif token.type in ("fence", "code_block"):
            # the first line without its comment: rewording a comment does not unclassify a block
            first = next((re.sub(r"\s+#.*", "", ln).strip() for ln in token.content.splitlines() if ln.strip()), "")
            blocks.append(Block(heading, token.info.strip(), first, token.content))
    return blocks


# (heading, first line of the block) -> the test that runs it, or why it cannot run here.
RUN = {
    ("Using it", ". .venv/bin/activate"): "test_using_it_command",
    ("Publishing from your agent", "import asyncio"): "test_publish_example_against_a_running_stack",
    ("Using it", "GW=$(engram status --json | python3 -c 'import json, sys; print(json.load(sys.stdin)[\"services\"][\"gateway\"][\"url\"])')"):
        "test_rest_walkthrough_against_a_running_stack",
}
NOT_RUN = {
    ("Two commands", "make demo"):
        "`make demo` and `make test` build a venv and run for minutes; `make test` is what CI runs "
        "(.ci/run), and the demo's steps are the commands of the 'Using it' block, run here",
    ("A local model (no API key)",
     "ollama pull qwen2.5:7b-instruct && ollama serve &"):
        "needs a model server (Ollama or llama.cpp) and a model of several GB: neither is on these machines; "
        "the OpenAI-compatible client it configures is tested against the LLM simulator "
        "(tests/engram/models/test_openai_provider.py, tests/engram/models/test_openai_real_model_defaults.py)",
    ("Sessions and the agent's context",
     "── user_context: 695/1500 tokens (group engram_user_0bfe935e70c321c7: 0 preferences, 43 notes)"):
        "example output, not a command: the `engram context` line of 'Using it' runs (after the same "
        "LoCoMo ingest), and tests/engram/cli/test_cli_context.py checks the layout and the budgets",
    ("MCP (Model Context Protocol)",
     '{"mcpServers": {"engram": {"command": "engram", "args": ["serve", "mcp", "--transport", "stdio"],'):
        "an MCP host's configuration, not a command: tests/services/mcp/test_mcp.py starts this "
        "command over stdio with the SDK's client",
}
NOT_RUN_COMMANDS = {
    "up": "the stack this module starts is `engram up --data-dir TMP` (tests.engram.cli.test_cli_up.Up): "
          "a second `up` on the same data dir refuses by design",
    "serve": "runs one service in the foreground until killed; `engram up` starts each of them",
    "backup": "writes into a new directory each time; backup and restore of a real stack, compared "
              "before and after, are tests/engram/cli/test_backup.py",
    "restore": "restores into a data dir no `engram up` runs on (this module's stack is running); "
               "tests/engram/cli/test_backup.py restores into a fresh one",
}


def test_every_readme_block_is_run_or_excused() -> None:
    found = {(b.heading, b.first_line) for b in readme_blocks()}
    unclassified = found - RUN.keys() - NOT_RUN.keys()
    assert not unclassified, f"README blocks neither run by tests/test_readme.py nor excused in NOT_RUN: {unclassified}"
    stale = (RUN.keys() | NOT_RUN.keys()) - found
    assert not stale, f"classified blocks no longer in the README: {stale}"
    assert not RUN.keys() & NOT_RUN.keys()
    for name in RUN.values():
        assert callable(globals().get(name)), name


# --- the "Using it" block -------------------------------------------------------------------------
def _using_it() -> Block:
    return next(b for b in readme_blocks() if b.heading == "Using it" and (b.heading, b.first_line) in RUN)


def _variants(tokens: list[str]) -> list[list[str]]:
    """The command without its optional `[...]` groups, and with all of them (when there are any)."""
    bare, full, group = [], [], None
    for token in tokens:
        if group is None and token.startswith("["):
            group, token = [], token[1:]
        if group is None:
            bare.append(token)
            full.append(token)
            continue
        closes = token.endswith("]")
        group.append(token.removesuffix("]"))
        if closes:
            full.extend(group)
            group = None
    assert group is None, f"unclosed [ in {tokens}"
    return [bare] if bare == full else [bare, full]


def using_it_commands() -> list[list[str]]:
    """Each `engram` line of the block as argv variants; every other line must be known."""
    commands = []
    for line in _using_it().text.splitlines():
        tokens = shlex.split(line, comments=True)
        if not tokens:
            continue  # blank, or a comment continuing the line above
        if tokens == [".", ".venv/bin/activate"]:
            continue  # what `ENGRAM` (the venv's console script) stands for
        assert tokens[0] == "engram", f"a line of the 'Using it' block this test does not know how to run: {line!r}"
        if tokens[1] in NOT_RUN_COMMANDS:
            continue
        commands.extend(_variants(tokens[1:]))
    return commands


def _env() -> dict[str, str]:
    # A developer's ENGRAM_NATS_URL etc. must not point the commands elsewhere; the embedder stays
    # the suite's (hashing unless the run says otherwise).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env["ENGRAM_EMBEDDER_PROVIDER"] = os.environ.get("ENGRAM_EMBEDDER_PROVIDER", "hashing")
    env["GRAPHITI_TELEMETRY_ENABLED"] = "false"
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data = tmp_path_factory.mktemp("readme") / "engram"
    up = Up(data, env={"ENGRAM_EMBEDDER_PROVIDER": _env()["ENGRAM_EMBEDDER_PROVIDER"]})
    try:
        yield data
    finally:
        assert up.stop() == 0, up.log_tail()


def _chat_jsonl(where: Path) -> Path:
    path = where / "chat.jsonl"
    lines = [
        {"session_id": "s1", "role": "user", "content": "Should the billing API keep using Postgres?",
         "timestamp": "2026-01-05T10:00:00Z"},
        {"session_id": "s1", "role": "assistant", "content": "We decided the billing API stays on Postgres 15.",
         "timestamp": "2026-01-05T10:00:05Z"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_engram(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(ENGRAM), *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", using_it_commands(), ids=shlex.join)
def test_using_it_command(args: list[str], stack: Path) -> None:
    args = list(args)
    if args[0] == "ingest" and args[1] == "chat.jsonl":
        args[1] = str(_chat_jsonl(stack.parent))
    elif args[0] == "ingest" and not (ROOT / args[1]).exists():
        pytest.skip(f"{args[1]} not found (LoCoMo is not part of the repository)")
    if "--data-dir" not in args:
        args += ["--data-dir", str(stack)]
    else:
        args[args.index("--data-dir") + 1] = str(stack)
    out = run_engram(args)
    deadline = time.monotonic() + 30
    while args[0] == "recall" and "Postgres 15" not in out.stdout and time.monotonic() < deadline:
        time.sleep(1)  # chat.jsonl's turn is extracted in the background; the README promises it is recalled
        out = run_engram(args)
    assert out.returncode == 0, f"engram {shlex.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    if "--json" in args:
        json.loads(out.stdout)
    if args[0] == "recall":
        assert "Postgres 15" in out.stdout, out.stdout


# --- the publishing example -----------------------------------------------------------------------
def test_publish_example_against_a_running_stack(stack: Path, tmp_path: Path) -> None:
    block = next(b for b in readme_blocks() if b.heading == "Publishing from your agent" and b.language == "python")
    status = run_engram(["status", "--json", "--data-dir", str(stack)])
    url = json.loads(status.stdout)["parts"]["nats"]["url"]  # where the README says the URL is
    # ... and the publisher user's password (engram up's NATS has one user per service, engram/runtime/auth.py)
    publisher = json.loads((stack / "auth" / "passwords.json").read_text())["publisher"]
    url = url.replace("nats://", f"nats://engram-publisher:{publisher}@", 1)
    script = tmp_path / "publish.py"
    script.write_text(block.text)
    env = {**_env(), "ENGRAM_NATS_URL": url, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["s1", "stored", "s2", "stored"]
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert again.stdout.split() == ["s1", "already", "stored", "s2", "already", "stored"]


def test_rest_walkthrough_against_a_running_stack(stack: Path) -> None:
    """The REST walkthrough, run as written by bash (curl -f: any non-2xx fails it), with `engram`
    finding the stack on its own (the last `engram up`, engram/stack/last_stack.py)."""
    block = next(b for b in readme_blocks() if b.first_line.startswith("GW=$(engram status --json"))
    env = {**_env(), "PATH": f"{ENGRAM.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert "Postgres 15" in out.stdout, out.stdout  # the search found the told fact
    assert '"stored":true' in out.stdout.replace(" ", "") and "deleted" in out.stdout.lower(), out.stdout

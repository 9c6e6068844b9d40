"""Output a person can read (issue 12, item 6): without a terminal, tables keep every column whole
(rich cut them to 80 columns) and `--json` gives scripts the data; recall counts facts and past
turns apart; the demo lists each fact once and no tool-output junk, says when it skips LoCoMo,
and words the summary-gate's savings without assuming an LLM."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
from pathlib import Path

import nats
from rich.console import Console
from rich.table import Table
from rich.text import Text

from engram.cli.support import print_table
from engram.cli.demo import demo_locomo, readable_facts
from engram.runtime.dlq import dead_letter
from engram.settings import EngramSettings
from engram.cli.status import summary_caption, summary_gate_table
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import RecallItem, RecallResponse, subjects
from tests.engram.cli.test_cli_up import ENGRAM, _env

LONG_DETAIL = ("ValidationError: session_id must match ^[a-zA-Z0-9_-]{1,128}$ " + "and more detail " * 6).strip()


def _cli(nats_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ENGRAM, *args, "--data-dir", str(tmp_path)], capture_output=True, text=True,
                          env={**_env(), "ENGRAM_NATS_URL": nats_url}, timeout=60)


def test_a_table_is_not_cut_when_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out)  # a StringIO is not a terminal: rich would use 80 columns
    assert not console.is_terminal
    table = Table(title="t")
    for col in ("seq", "detail", "subject"):
        table.add_column(col)
    table.add_row("1", Text(LONG_DETAIL), "engram.in.message.some-rather-long-session-id-0123456789")
    print_table(console, table)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("│ 1 "))
    assert LONG_DETAIL.strip() in row and "engram.in.message.some-rather-long-session-id-0123456789" in row
    assert "…" not in out.getvalue()


async def test_dlq_list_shows_whole_columns_and_json(clean_nats: str, tmp_path: Path) -> None:
    nc = await nats.connect(clean_nats)
    try:
        js = nc.jetstream()
        await ensure_topology(js, Topology.from_settings(EngramSettings(nats_url=clean_nats)))
        await dead_letter(js, stage="turn_detector", reason="invalid_message", detail=LONG_DETAIL,
                          subject="engram.in.message.some-rather-long-session-id-0123456789", payload=b"{}",
                          headers={}, source_id="1")
    finally:
        await nc.close()
    table = await asyncio.to_thread(_cli, clean_nats, tmp_path, "dlq", "list")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "invalid_message" in line)
    assert LONG_DETAIL.strip() in row and "engram.in.message.some-rather-long-session-id-0123456789" in row
    as_json = await asyncio.to_thread(_cli, clean_nats, tmp_path, "dlq", "list", "--json")
    rows = json.loads(as_json.stdout)
    assert [(r["stage"], r["reason"], r["detail"]) for r in rows] == [("turn_detector", "invalid_message", LONG_DETAIL)]


async def test_recall_counts_facts_and_past_turns_apart(clean_nats: str, tmp_path: Path) -> None:
    """A stand-in recall responder on the real subject: the CLI's labels, not the search, are tested."""
    items = [RecallItem(uuid="f1", fact="Ada deploys on Fridays.", group_id="g", kind="fact"),
             RecallItem(uuid="e1", fact="user: when do we deploy?", group_id="g", kind="episode"),
             RecallItem(uuid="e2", fact="assistant: on Fridays.", group_id="g", kind="episode")]
    answers = [RecallResponse(items=items, prompt_section="<memory>[bold]Fridays[/bold]</memory>", took_ms=3.0),
               RecallResponse(degraded=True, reason="timeout after 2000 ms", took_ms=2000.0)]
    nc = await nats.connect(clean_nats)

    async def answer(msg) -> None:  # noqa: ANN001
        await msg.respond(answers.pop(0).model_dump_json().encode())

    await nc.subscribe(subjects.RECALL, cb=answer)
    try:
        out = await asyncio.to_thread(_cli, clean_nats, tmp_path, "recall", "when do we deploy?", "--user", "ada")
        assert out.returncode == 0, out.stderr
        assert "<memory>[bold]Fridays[/bold]</memory>" in out.stdout  # the prompt section verbatim
        assert "1 fact, 2 past turns in 3.0 ms" in out.stdout
        degraded = await asyncio.to_thread(_cli, clean_nats, tmp_path, "recall", "when?", "--user", "ada")
        assert degraded.returncode == 1
        assert [x for x in degraded.stderr.splitlines() if x.startswith("error: ")] == [
            "error: recall degraded: timeout after 2000 ms (check the stack with `engram status`)"]
    finally:
        await nc.close()


def test_demo_facts_are_sentences_each_shown_once() -> None:
    graph_facts = [  # what the demo's graph held (engram demo, rules extractor)
        "Assistant added `httpx==0.28.1` to pyproject.toml and re-ran the tests.",
        "Decision: pin every direct dependency in pyproject.toml so CI matches laptops.",
        "tests/test_mod19.py ....",
        "Assistant added `httpx==0.28.1` to pyproject.toml and re-ran the tests.",
        "graphiti-core imports httpx but does not declare it.",
        "[stack trace: OSError: [Errno 98] Address already in use (at server.py:88)]",
    ]
    assert readable_facts(graph_facts, limit=10) == [
        "Assistant added `httpx==0.28.1` to pyproject.toml and re-ran the tests.",
        "Decision: pin every direct dependency in pyproject.toml so CI matches laptops.",
        "graphiti-core imports httpx but does not declare it.",
        "[stack trace: OSError: [Errno 98] Address already in use (at server.py:88)]",
    ]
    assert readable_facts(graph_facts, limit=2) == graph_facts[:2]


def test_demo_says_when_it_skips_locomo(tmp_path: Path) -> None:
    out = io.StringIO()
    missing = tmp_path / "locomo7.json"
    assert demo_locomo(None, Console(file=out), default=missing) is None
    assert f"LoCoMo data not found at {missing}" in out.getvalue()
    assert "--locomo" in out.getvalue()
    given = tmp_path / "mine.json"
    assert demo_locomo(given, Console(file=io.StringIO()), default=missing) == given
    missing.write_text("[]")
    quiet = io.StringIO()
    assert demo_locomo(None, Console(file=quiet), default=missing) == missing and quiet.getvalue() == ""


def test_summary_gate_savings_in_words() -> None:
    summary = {"refreshed": {"new_entity": 10}, "composed": {"new_entity": 8}, "skipped": {"low_drift": 5},
               "deferred": 1, "llm_calls": 2.0, "deltas": 16.0}
    assert summary_caption(summary) == "16 deltas, 2 summary-model calls: 88% fewer than one call per delta"
    with_model = summary_caption(summary, "engram's offline rules model, no LLM")
    assert with_model is not None and with_model.endswith("(summary model: engram's offline rules model, no LLM)")
    assert "LLM calls" not in with_model and "skipped" not in with_model
    assert summary_caption({"deltas": 0}) is None
    out = io.StringIO()
    print_table(Console(file=out), summary_gate_table(summary))
    assert "composed, no model call" in out.getvalue()

"""`engram demo`: the README's first command. Starts `engram up` (embedded NATS + FalkorDB) as a
child process, ingests a coding-agent session (examples/) and one LoCoMo conversation when the
data set is present, waits until the pipeline is idle, shows the turns it built and the status,
then stops everything."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from engram.bundled import EXAMPLES_DIR
from engram.cli.support import error_line, plain, print_table
from engram.stack.datadir_lock import lock_holder
from engram.publishing.ingest import publish_events, read_jsonl, read_locomo
from engram.settings import EngramSettings
from engram.cli.status import collect_status, summary_caption, summary_gate_table
from engram.schemas import Episode, RecallRequest, RecallResponse, RecallScopes, ScopeKeys, subjects

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = EXAMPLES_DIR / "coding-session.jsonl"  # package data: found in a wheel install too
CHANGE_EXAMPLE = EXAMPLES_DIR / "billing-change.jsonl"
"""Two sessions a week apart: Postgres for billing, then the switch to SQLite (memory changing its mind)."""
CHANGE_QUESTION = "Are we still on Postgres for billing?"
# beside a source checkout only (LoCoMo is not part of engram): a wheel install skips it or takes --locomo
DEFAULT_LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"


def _wait_up(settings: EngramSettings, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"`engram up` exited with {proc.returncode}; see {settings.data_dir / 'up.log'}")
        if settings.runtime_file.exists():
            return
        time.sleep(0.2)
    raise RuntimeError("`engram up` did not become ready in time")


async def _wait_idle(nc: nats.NATS, stream: str, timeout: float = 300.0) -> None:
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        infos = await js.consumers_info(stream)
        if all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos if c.config.durable_name):
            return
        await asyncio.sleep(0.25)


_WORD = re.compile(r"^[A-Za-z][A-Za-z'’-]*[.,;:!?]?$")


def readable_facts(facts: list[str], limit: int) -> list[str]:
    """The facts worth showing a person: each once (the rules extractor states one sentence as a
    fact per pair of entities it names, so the same text comes back several times), and only
    sentences: a "fact" with fewer than three plain words (``tests/test_mod19.py ....``, a line of
    tool output) is left out."""
    seen: set[str] = set()
    out = []
    for fact in facts:
        key = " ".join(fact.split()).casefold()
        if key in seen or sum(1 for token in fact.split() if _WORD.match(token)) < 3:
            continue
        seen.add(key)
        out.append(fact)
    return out[:limit]


def _graph_sample(graph_url: str, group: str, limit: int = 12) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Entity names, current facts (in the order they were learned) and the longest summaries of
    one group's graph (FalkorDB)."""
    from urllib.parse import urlparse

    from falkordb import FalkorDB

    url = urlparse(graph_url)
    # the URL carries engram up's FalkorDB password (requirepass): without it every query is refused
    graph = FalkorDB(host=url.hostname, port=url.port, password=url.password).select_graph(group)
    names = [r[0] for r in graph.query("MATCH (n:Entity) RETURN n.name ORDER BY n.name").result_set]
    summaries = [(r[0], r[1]) for r in graph.query(
        "MATCH (n:Entity) WHERE n.summary <> '' RETURN n.name, n.summary ORDER BY size(n.summary) DESC LIMIT 4"
    ).result_set]
    facts = [r[0] for r in graph.query(
        "MATCH ()-[e:RELATES_TO]->() WHERE e.expired_at IS NULL RETURN e.fact ORDER BY e.created_at LIMIT $n",
        {"n": limit * 4},
    ).result_set]
    return names, readable_facts(facts, limit), summaries


async def _session_episodes(nc: nats.NATS, group: str) -> list[Episode]:
    js = nc.jetstream()
    # stored as engram.episode.<partition>.<group> (see engram/runtime/topology.py)
    sub = await js.subscribe(f"engram.episode.*.{group}", stream=subjects.STREAM_EPISODES, ordered_consumer=True)
    out = []
    try:
        while True:
            try:
                m = await sub.next_msg(timeout=0.5)
            except (asyncio.TimeoutError, TimeoutError):
                break
            out.append(Episode.model_validate_json(m.data))
    finally:
        await sub.unsubscribe()
    return out


DEMO_RECALL_TIMEOUT_MS = 20_000


def _demo_questions(with_locomo: bool) -> list[tuple[str, RecallRequest]]:
    """What an agent would ask recall before answering (the same as `engram recall ...`)."""
    # A first recall loads the embedder and warms the graph's indexes: the demo waits for it
    # rather than showing "(nothing recalled: timeout after 500 ms)".
    questions = [("Why did the tests fail on CI?", RecallRequest(
        query="Why did the tests fail on CI?", scopes=RecallScopes(session="coding-1", workspace="examples/engram"),
        max_facts=5, token_budget=600, timeout_ms=DEMO_RECALL_TIMEOUT_MS)),
        # memory changing its mind: the switch comes first, the Postgres turn is marked superseded
        (CHANGE_QUESTION + " (a week after the switch)", RecallRequest(
            query=CHANGE_QUESTION, scopes=RecallScopes(workspace="examples/engram"),
            max_facts=5, token_budget=400, timeout_ms=DEMO_RECALL_TIMEOUT_MS))]
    if with_locomo:
        questions.append(("When did Caroline go to the LGBTQ support group?", RecallRequest(
            query="When did Caroline go to the LGBTQ support group?", scopes=RecallScopes(user="locomo-conv-26"),
            max_facts=5, token_budget=600, timeout_ms=DEMO_RECALL_TIMEOUT_MS)))
    return questions


async def _ingest_and_show(settings: EngramSettings, locomo: Path | None, console: Console) -> None:
    fresh = EngramSettings(data_dir=settings.data_dir)  # re-reads the runtime file
    nc = await nats.connect(fresh.resolved_nats_url(), **fresh.nats_options())
    try:
        js = nc.jetstream()
        scopes = ScopeKeys(workspace="examples/engram", user="demo-user")
        report = await publish_events(js, read_jsonl(EXAMPLE, scopes))
        plain(console, f"ingested {EXAMPLE.name}: {report.messages} messages, {report.sessions} session")
        report = await publish_events(js, read_jsonl(CHANGE_EXAMPLE, scopes))
        plain(console, f"ingested {CHANGE_EXAMPLE.name}: {report.messages} messages in {report.sessions} sessions "
                       "a week apart (billing on Postgres 15, then switched to SQLite)")
        if locomo is not None:
            report = await publish_events(js, read_locomo(locomo, ScopeKeys(user="locomo-conv-26"), ["conv-26"]))
            plain(console, f"ingested LoCoMo conv-26: {report.messages} messages in {report.sessions} sessions "
                           "(speaker_a = user, speaker_b = assistant)")
        await _wait_idle(nc, subjects.STREAM_IN)
        for ep in await _session_episodes(nc, subjects.session_group(fresh.group_prefix, "coding-1")):
            details = [ep.completed_by, f"{len(ep.messages)} {'message' if len(ep.messages) == 1 else 'messages'}"]
            details += [f"{ep.stats.secrets_scrubbed} secrets scrubbed"] if ep.stats.secrets_scrubbed else []
            details += [f"reduced: {', '.join(ep.stats.reductions)}"] if ep.stats.reductions else []
            # the details go below the turn: a panel cuts a title longer than its width
            console.print(Panel(Text(ep.content), title=Text(f"turn {ep.turn_id}"), title_align="left",
                                subtitle=Text(", ".join(details)), subtitle_align="left"))
        plain(console, f"extracting the knowledge graph ({_extraction_model()}) ...")
        await _wait_idle(nc, subjects.STREAM_EPISODES)
        console.print("refreshing entity summaries where the facts changed (summary-gate) ...")
        await _wait_idle(nc, subjects.STREAM_DELTAS)
        graph_url = fresh.resolved_graph_url()
        if graph_url:
            group = subjects.session_group(fresh.group_prefix, "coding-1")
            names, facts, summaries = await asyncio.to_thread(_graph_sample, graph_url, group)
            text = "entities: " + ", ".join(names) + "\n\nfacts:\n" + "\n".join(f"- {f}" for f in facts)
            text += "\n\nsummaries:\n" + "\n".join(f"- {name}: {summary}" for name, summary in summaries)
            console.print(Panel(Text(text), title=Text(f"graph {group}"), title_align="left"))
        for title, request in _demo_questions(locomo is not None):
            reply = await nc.request(subjects.RECALL, request.model_dump_json().encode(),
                                     timeout=request.timeout_ms / 1000 + 5)
            answer = RecallResponse.model_validate_json(reply.data)
            body = answer.prompt_section or f"(nothing recalled: {answer.reason})"
            facts = sum(1 for item in answer.items if item.kind == "fact")
            shown = f"{facts} facts, {len(answer.items) - facts} past turns, {answer.took_ms:.0f} ms"
            console.print(Panel(Text(body), title=Text(f"engram recall: {title}"), title_align="left",
                                subtitle=Text(shown), subtitle_align="left"))
    finally:
        await nc.close()
    status = await collect_status(EngramSettings(data_dir=settings.data_dir))
    table = Table(title="engram status")
    table.add_column("count")
    table.add_column("n", justify="right")
    for k, v in status["counts"].items():
        table.add_row(k, str(v))
    print_table(console, table)
    plain(console, "(all of it: engram status --json)", style="dim")
    if status.get("summary_gate"):
        print_table(console, summary_gate_table(status["summary_gate"]))
        caption = summary_caption(status["summary_gate"], _summary_model())
        if caption:
            plain(console, caption)


def _summary_model() -> str:
    """The model `engram up` summarises with (the demo starts it with the demo's own environment)."""
    from engram.models.factory import LLMSettings

    llm = LLMSettings()
    return "engram's offline rules model, no LLM" if llm.provider == "rules" else f"{llm.provider} {llm.model}"


def _extraction_model() -> str:
    from engram.models.factory import LLMSettings

    llm = LLMSettings()
    return "offline rules extractor, no LLM" if llm.provider == "rules" else f"{llm.provider} {llm.model}"


DEFAULT_DEMO_DIR = Path(".engram/demo")
"""Relative to the working directory: the demo never runs in the real stack's data dir."""
DEMO_MARKER = ".engram-demo"
"""Written into every directory the demo creates; only directories holding it are ever wiped."""


class DemoDirRefused(RuntimeError):
    """The demo would have to delete or share files it does not own."""


def prepare_demo_dir(data_dir: Path) -> None:
    """Make data_dir an empty directory the demo owns, or refuse.

    A missing or empty directory becomes the demo's (marked with DEMO_MARKER). A directory the
    demo marked earlier is emptied, unless an `engram up` still holds it. Anything else (a file, a
    non-empty directory without the marker, such as a real stack's data dir) is refused untouched.
    """
    if data_dir.exists() and not data_dir.is_dir():
        raise DemoDirRefused(f"{data_dir} is not a directory; give the demo a new or empty directory")
    if data_dir.is_dir() and any(data_dir.iterdir()):
        if not (data_dir / DEMO_MARKER).is_file():
            raise DemoDirRefused(
                f"{data_dir} is not empty and was not created by `engram demo`; it is left untouched. "
                "Give --data-dir a new or empty directory"
            )
        holder = lock_holder(data_dir)
        if holder is not None:
            raise DemoDirRefused(f"{data_dir} is in use by a running engram (supervisor pid {holder or 'unknown'})")
        shutil.rmtree(data_dir)  # the demo's own directory (marked above): start clean every time
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / DEMO_MARKER).write_text("created by `engram demo`; `engram demo` may delete this directory\n")


def demo_locomo(given: Path | None, console: Console, default: Path = DEFAULT_LOCOMO) -> Path | None:
    """The LoCoMo file the demo ingests: the one given, else the default when it is there; saying
    so when the LoCoMo part is skipped."""
    if given is not None:
        return given
    if default.exists():
        return default
    plain(console, f"LoCoMo data not found at {default}: the demo skips its LoCoMo conversation "
                   "(give one with --locomo PATH)", style="yellow")
    return None


def run_demo(settings: EngramSettings, locomo: Path | None, console: Console) -> int:
    locomo = demo_locomo(locomo, console)
    try:
        prepare_demo_dir(settings.data_dir)
    except DemoDirRefused as exc:
        error_line(console, f"demo refused: {exc}")
        return 2
    env = {k: v for k, v in os.environ.items() if k not in ("ENGRAM_NATS_URL", "ENGRAM_GRAPH_URL")}
    log = open(settings.data_dir / "up.log", "wb")  # noqa: SIM115
    plain(console, "the demo takes 1-4 minutes on a 2-core laptop (most of it LoCoMo conv-26, when present) "
                   "and stops everything it started")
    plain(console, f"starting engram (embedded NATS + FalkorDB) in {settings.data_dir} ...")
    proc = subprocess.Popen(
        # -P: not the working directory's engram/ (a checkout) instead of the installed one (supervisor.py)
        [sys.executable, "-P", "-m", "engram.cli", "up", "--data-dir", str(settings.data_dir)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        _wait_up(settings, proc)
        console.print("engram is up; publishing conversations into engram.in.message.<session> ...")
        asyncio.run(_ingest_and_show(settings, locomo, console))
        return 0
    except Exception as exc:  # noqa: BLE001
        from engram.cli.support import explain

        error_line(console, f"demo failed: {explain(exc)} (the stack's log: {settings.data_dir / 'up.log'})")
        return 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        console.print("engram stopped (no process left behind).")

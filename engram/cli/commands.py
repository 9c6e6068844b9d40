"""The `engram` command (Typer + Rich). Users' scripts depend on it: keep it stable.

Every command fails with one line on stderr that says what is wrong and what to do, and a
non-zero exit; the traceback only with ``--debug`` (engram/cli/support.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from engram.cli.support import (  # noqa: E402
    CliError,
    EngramGroup,
    error_line,
    nats_connection,
    nats_url_or_fail,
    plain,
    running_stack_or_fail,
    print_json,
    print_table,
    unreachable,
)
from engram.settings import EngramSettings  # noqa: E402

app = typer.Typer(help="engram: conversation memory for agents over NATS.", no_args_is_help=True, cls=EngramGroup,
                  pretty_exceptions_show_locals=False)
dlq_app = typer.Typer(help="Inspect and replay dead letters.", no_args_is_help=True, cls=EngramGroup,
                      pretty_exceptions_show_locals=False)
app.add_typer(dlq_app, name="dlq")
memory_app = typer.Typer(help="Read and write user memory (preferences, notes, favorites, activity) as an agent's tools do.",
                         no_args_is_help=True, cls=EngramGroup, pretty_exceptions_show_locals=False)
app.add_typer(memory_app, name="memory")
console = Console()
err = Console(stderr=True)


def _data_dir_is_a_directory(value: Optional[Path]) -> Optional[Path]:
    if value is not None and value.exists() and not value.is_dir():
        raise typer.BadParameter(f"{value} is a file; give a directory")
    return value


DataDir = Annotated[
    Optional[Path], typer.Option("--data-dir", help="Where embedded servers keep data (default ~/.local/share/engram).",
                                 callback=_data_dir_is_a_directory)
]


def _bad_parameter(exc: Exception, options: dict[str, str]) -> typer.BadParameter:
    """A pydantic ValidationError as a usage error naming the option (``options``: field -> option)."""
    first = exc.errors()[0]  # type: ignore[attr-defined]
    loc = [str(p) for p in first["loc"] if not isinstance(p, int)]
    option = next((options[k] for k in (".".join(loc), *loc[::-1]) if k in options),
                  "--" + (loc[-1] if loc else "value").replace("_", "-"))
    got = first.get("input")
    shown = f"{got!r}: " if isinstance(got, (str, int, float)) and len(repr(got)) <= 80 else ""
    return typer.BadParameter(f"{shown}{first['msg']}", param_hint=f"'{option}'")


def _settings(data_dir: Path | None = None, *, find_running: bool = True) -> EngramSettings:
    """The settings of the stack a command talks to: ``--data-dir``, else the environment, else the
    running stack engram/stack/last_stack.py finds (said on stderr). ``find_running`` False for the
    commands that start servers themselves (up, restore, demo)."""
    if data_dir is not None:
        return EngramSettings(data_dir=data_dir.expanduser().resolve())
    settings = EngramSettings()
    if (find_running and "ENGRAM_DATA_DIR" not in os.environ and not settings.nats_url
            and not settings.runtime_file.exists()):
        from engram.stack import last_stack

        found = last_stack.running_data_dir()
        if found is not None:
            plain(err, f"using the stack running in {found} (the last `engram up`; --data-dir to choose)", style="dim")
            return EngramSettings(data_dir=found)
    return settings


class Service(str, Enum):
    turn_detector = "turn-detector"
    extractor = "extractor"
    summary_gate = "summary-gate"
    recall = "recall"
    gateway = "gateway"
    sessions = "sessions"
    mcp = "mcp"


SERVICE_MODULES = {
    Service.turn_detector: "engram.services.turn_detector.app",
    Service.extractor: "engram.services.extractor.app",
    Service.summary_gate: "engram.services.summary_gate.app",
    Service.recall: "engram.services.recall.app",
    Service.gateway: "engram.services.gateway.app",
    Service.sessions: "engram.services.sessions.app",
    Service.mcp: "engram.services.mcp.app",
}


@app.command()
def up(data_dir: DataDir = None) -> None:
    """Start NATS, FalkorDB and every service; Ctrl-C stops everything."""
    from engram.runtime.service import configure_logging
    from engram.stack.supervisor import run_up

    settings = _settings(data_dir, find_running=False)
    configure_logging(settings.log_level)

    def ready(sup) -> None:  # noqa: ANN001
        table = Table(title="engram is up", show_header=True)
        table.add_column("part")
        table.add_column("url")
        table.add_row("nats", sup.nats_url + ("" if sup.nats else "  (external)"))
        if sup.nats and sup.nats.extra.get("monitoring_url"):
            table.add_row("nats monitoring", sup.nats.extra["monitoring_url"])
        if sup.graph_url:
            table.add_row("falkordb", sup.graph_url + ("" if sup.falkordb else "  (external)"))
        for svc in sup.services:
            table.add_row(svc.name, f"{svc.url}/metrics  {svc.url}/healthz")
            if svc.name == "gateway":
                table.add_row("graphiti REST api", f"{svc.url}  (docs: {svc.url}/docs)")
                # the gateway of `engram up` listens on loopback, with no API key unless one is set
                key = "API key: ENGRAM_GATEWAY_API_KEY" if os.environ.get("ENGRAM_GATEWAY_API_KEY") else "no API key needed"
                table.add_row("memory explorer", f"{svc.url}/explorer  ({key})")
            if svc.name == "mcp":
                table.add_row("mcp (streamable http)", f"{svc.url}/mcp")
        print_table(console, table)
        plain(console, f"data: {settings.data_dir}   logs: {settings.data_dir / 'logs'}   Ctrl-C to stop")

    try:
        code = asyncio.run(run_up(settings, on_ready=ready))
    except RuntimeError as exc:
        error_line(err, f"engram up failed: {exc}")
        raise typer.Exit(1) from exc
    console.print("engram stopped")
    raise typer.Exit(code)


@app.command()
def serve(service: Service, data_dir: DataDir = None,
          transport: Annotated[str, typer.Option(help="mcp only: http (streamable HTTP at /mcp) or stdio.")] = "http",
          ) -> None:
    """Run one service in the foreground (what `engram up`, compose and Kubernetes run)."""
    import importlib

    from engram.runtime.service import configure_logging

    settings = _settings(data_dir)
    nats_url_or_fail(settings)  # no NATS to wait for at all: say so rather than fail inside the service
    configure_logging(settings.log_level)  # to stderr: stdout stays the MCP channel under stdio
    if transport not in ("http", "stdio") or (transport == "stdio" and service is not Service.mcp):
        error_line(err, "--transport is http, or stdio for the mcp service")
        raise typer.Exit(2)
    module = importlib.import_module(SERVICE_MODULES[service])  # by name: engram/ never imports services/
    if transport == "stdio":
        asyncio.run(module.run_stdio(settings))
        return
    service_app = module.build(settings)
    asyncio.run(
        service_app.asgi().run(
            run_extra_options={"host": settings.http_host, "port": settings.http_port, "access_log": "false"}
        )
    )


@app.command()
def topology(data_dir: DataDir = None) -> None:
    """Create or update engram's streams, consumers and KV buckets, then exit (run as the NATS admin
    user where services have least-privilege users: a compose or Kubernetes job)."""
    import dataclasses

    from engram.runtime.topology import Topology, ensure_topology

    settings = _settings(data_dir)

    async def declare() -> int:
        async with nats_connection(settings, name="engram-topology") as nc:
            topo = dataclasses.replace(Topology.from_settings(settings), manage=True)
            await ensure_topology(nc.jetstream(), topo, migrate=True)
            return len(topo.streams())

    streams = asyncio.run(declare())
    plain(console, f"topology ok: {streams} streams, their consumers and KV buckets")


def _graph_unreachable(settings: EngramSettings, exc: BaseException) -> CliError:
    """What export, import and backup say when the graph does not answer."""
    return CliError(f"cannot reach the graph of engram in {settings.data_dir} ({type(exc).__name__}): is it "
                    "running? (`engram status`)")


@app.command()
def export(
    group: Annotated[str, typer.Option(help="The group id to export (engram status lists groups; recall's answers "
                                            "name theirs).")],
    out: Annotated[Optional[Path], typer.Option(help="Write here instead of standard output.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Write one group's memory (episodes, entities, facts, preferences, notes, session summaries) as
    JSONL, to take elsewhere with `engram import` (engram/graph/export.py)."""
    from engram.graph.export import ExportError, export_lines

    settings = _settings(data_dir)
    running_stack_or_fail(settings)
    try:
        lines = asyncio.run(export_lines(settings, group))
    except ExportError as exc:
        raise CliError(str(exc)) from exc
    except (ConnectionError, OSError) as exc:
        raise _graph_unreachable(settings, exc) from exc
    text = "\n".join(lines) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        plain(err, f"exported {len(lines) - 1} nodes and edges of {group} to {out}", style="dim")


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="An `engram export` file.", exists=True, dir_okay=False, readable=True)],
    group: Annotated[Optional[str], typer.Option(help="Import into this group id instead of the exported one.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Write an `engram export` file into this stack's graph; importing it again changes nothing."""
    from engram.graph.export import ExportError, import_lines

    settings = _settings(data_dir)
    running_stack_or_fail(settings)
    try:
        with file.open(encoding="utf-8") as lines:
            result = asyncio.run(import_lines(settings, lines, group))
    except ExportError as exc:
        raise CliError(f"{file}: {exc}") from exc
    except (ConnectionError, OSError) as exc:
        raise _graph_unreachable(settings, exc) from exc
    plain(console, f"imported {result['nodes']} nodes and {result['edges']} edges into {result['group_id']}")


@app.command()
def backup(
    directory: Annotated[Path, typer.Argument(help="A new (or empty) directory for the backup.", file_okay=False)],
    data_dir: DataDir = None,
) -> None:
    """Back up a running stack: every NATS stream with its consumers, then every group's graph,
    consistent with each other (engram/cli/backup.py); `engram restore` brings it back."""
    from engram.cli.backup import BackupError
    from engram.cli.backup import backup as run_backup

    settings = _settings(data_dir)
    running_stack_or_fail(settings)

    async def run():  # noqa: ANN202
        async with nats_connection(settings, name="engram-backup") as nc:
            return await run_backup(settings, nc, directory)

    import nats.errors

    try:
        report = asyncio.run(run())
    except BackupError as exc:
        raise CliError(str(exc)) from exc
    except nats.errors.TimeoutError as exc:  # an OSError too: said first, it is NATS that did not answer
        raise CliError("NATS did not answer in time during the backup: is the stack overloaded? (`engram status`); "
                       f"remove {directory} and run it again") from exc
    except (ConnectionError, OSError) as exc:
        raise _graph_unreachable(settings, exc) from exc
    plain(console, f"backed up {len(report.streams)} streams ({sum(report.streams.values())} messages) and "
                   f"{len(report.groups)} groups to {directory}")


@app.command()
def restore(
    directory: Annotated[Path, typer.Argument(help="An `engram backup` directory.", exists=True, file_okay=False)],
    data_dir: DataDir = None,
) -> None:
    """Restore an `engram backup` into a data dir that holds no memory yet, with no `engram up`
    running on it; then `engram up` carries on where the backup was taken."""
    from engram.cli.backup import BackupError, restore_into
    from engram.stack.datadir_lock import DataDirLocked

    settings = _settings(data_dir, find_running=False)
    try:
        report = asyncio.run(restore_into(settings, directory))
    except BackupError as exc:
        raise CliError(str(exc)) from exc
    except DataDirLocked as exc:
        raise CliError(f"{exc}: stop it first (a restore writes the data dir's servers itself)") from exc
    except (ConnectionError, OSError, RuntimeError) as exc:  # a server that would not start or answer
        raise CliError(f"the restore could not run ({type(exc).__name__}: {exc}); nothing is kept half way only "
                       "if it failed before the first stream: otherwise remove the data dir and restore again") from exc
    plain(console, f"restored {len(report.streams)} streams ({sum(report.streams.values())} messages) and "
                   f"{len(report.groups)} groups into {settings.data_dir}")


@app.command()
def status(json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
           data_dir: DataDir = None) -> None:
    """Health of each part, stream and consumer backlog, counts of messages, turns, episodes."""
    from engram.cli.status import collect_status

    settings = _settings(data_dir)
    result = asyncio.run(collect_status(settings))
    nats_part = result["parts"].get("nats", {})
    if not nats_part.get("ok"):
        # Nothing else can be known without NATS: one line that says why (and JSON for scripts).
        if json_output:
            print_json(console, result)
        try:
            nats_url_or_fail(settings)
        except CliError as exc:
            error_line(err, str(exc))
            raise typer.Exit(exc.code) from exc
        error_line(err, unreachable(settings, str(nats_part.get("url")), str(nats_part.get("detail"))))
        raise typer.Exit(1)
    if json_output:
        print_json(console, result)
    else:
        _print_status(result)
    if not result.get("ok"):
        down = [name for name, p in {**result["parts"], **result.get("services", {})}.items() if not p.get("ok")]
        error_line(err, f"not healthy: {', '.join(down)} (see above; `engram doctor` checks each part)")
    raise typer.Exit(0 if result.get("ok") else 1)


def _print_status(result: dict) -> None:
    parts = Table(title="parts")
    for col in ("part", "ok", "url / detail"):
        parts.add_column(col)
    for name, p in result["parts"].items():
        parts.add_row(name, "[green]yes[/]" if p.get("ok") else "[red]no[/]", Text(str(p.get("url") or p.get("detail"))))
    for name, s in result.get("services", {}).items():
        parts.add_row(name, "[green]yes[/]" if s["ok"] else "[red]no[/]", Text(s["url"]))
    print_table(console, parts)
    streams = Table(title="streams and consumers")
    for col in ("stream", "consumer", "messages", "pending", "ack pending", "redelivered"):
        streams.add_column(col)
    for stream, info in result.get("streams", {}).items():
        if info is None:
            streams.add_row(stream, "-", "missing", "", "", "")
            continue
        streams.add_row(stream, "", str(info["messages"]), "", "", "")
        for cname, c in info["consumers"].items():
            streams.add_row("", cname, "", str(c["pending"]), str(c["ack_pending"]), str(c["redelivered"]))
    print_table(console, streams)
    from engram.cli.status import COUNT_MEANINGS

    counts = Table(title="counts")
    counts.add_column("what")
    counts.add_column("n", justify="right")
    counts.add_column("counts")
    for k, v in result.get("counts", {}).items():
        counts.add_row(k, str(v), Text(COUNT_MEANINGS.get(k, ""), style="dim"))
    print_table(console, counts)
    if result.get("summary_gate"):
        from engram.cli.status import summary_caption, summary_gate_table

        print_table(console, summary_gate_table(result["summary_gate"]))
        caption = summary_caption(result["summary_gate"])
        if caption:
            plain(console, caption)


def _as_of(text: str | None) -> Any:
    """``--as-of``: an ISO time (no zone: UTC) or a date (the end of that day, UTC)."""
    from datetime import datetime, time, timezone

    if text is None:
        return None
    try:
        if len(text.strip()) == 10:  # a date alone: everything said that day counts
            return datetime.combine(datetime.fromisoformat(text.strip()).date(), time.max, timezone.utc)
        when = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not an ISO 8601 date or time (e.g. 2026-09-15 or "
                                 "2026-09-15T12:00:00+02:00)", param_hint="'--as-of'") from exc
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


@app.command()
def recall(
    query: Annotated[str, typer.Argument(help="What to remember, e.g. the user's latest message.")],
    session: Annotated[Optional[str], typer.Option(help="Session id (the publisher's session_id).")] = None,
    workspace: Annotated[Optional[str], typer.Option(help="Workspace key, as given to ingest/publishers.")] = None,
    user: Annotated[Optional[str], typer.Option(help="User key, as given to ingest/publishers.")] = None,
    group: Annotated[Optional[list[str]], typer.Option(help="Extra group id(s) to search.")] = None,
    max_facts: Annotated[int, typer.Option(help="Facts at most.")] = 10,
    token_budget: Annotated[int, typer.Option(help="Tokens at most for the prompt section.")] = 1500,
    timeout_ms: Annotated[int, typer.Option(help="Recall answers (maybe empty) within this time.")] = 2000,
    as_of: Annotated[Optional[str], typer.Option(
        help="Remember as it was at this time: facts true then, turns said by then. ISO 8601 "
             "(2026-09-15T12:00:00+02:00; no zone: UTC; a date alone: the end of that day, UTC).")] = None,
    edge_type: Annotated[Optional[list[str]], typer.Option(help="Only facts of this relation name (e.g. USES); repeatable.")] = None,
    min_similarity: Annotated[Optional[float], typer.Option(
        help="Relevance floor: what shares no word with QUERY needs at least this cosine (-1: none; default: the "
             "deployment's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="The RecallResponse as JSON.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Ask engram's recall service for memory about QUERY across session, workspace and user scopes.

    Exits 1 when recall answered degraded (timeout or backend error; the answer may be empty), and
    when none of the scopes holds any memory (a mistyped key, say)."""
    import re

    from pydantic import ValidationError

    from engram.schemas import RecallRequest, RecallResponse, RecallScopes, subjects

    for g in group or []:
        if not re.match(subjects.TOKEN_PATTERN, g):
            raise typer.BadParameter(
                f"{g!r} is not a group id (letters, digits, _ and -, at most 200: {subjects.TOKEN_PATTERN})",
                param_hint="'--group'")
    if not (session or workspace or user or group):
        raise CliError("give at least one of --session, --workspace, --user or --group: recall searches only the "
                       "scopes it is given (see `engram recall --help`)", code=2)
    try:
        request = RecallRequest(
            query=query, scopes=RecallScopes(session=session, workspace=workspace, user=user), group_ids=group or [],
            max_facts=max_facts, token_budget=token_budget, timeout_ms=timeout_ms,
            as_of=_as_of(as_of), edge_types=edge_type or [], min_similarity=min_similarity,
        )
    except ValidationError as exc:
        raise _bad_parameter(exc, {"group_ids": "--group", "query": "QUERY", "edge_types": "--edge-type",
                                   "min_similarity": "--min-similarity"}) from exc
    settings = _settings(data_dir)

    # the groups the request names: an answer with nothing is "no memory there at all" when none exists
    named = {g for g in (subjects.session_group(settings.group_prefix, session) if session else None,
                         subjects.workspace_group(settings.group_prefix, workspace) if workspace else None,
                         subjects.user_group(settings.group_prefix, user) if user else None, *(group or [])) if g}

    async def ask() -> tuple[RecallResponse, bool]:
        from engram.schemas.messages import GraphGroupsRequest, GraphGroupsResponse

        async with nats_connection(settings) as nc:
            reply = await nc.request(subjects.RECALL, request.model_dump_json().encode(), timeout=timeout_ms / 1000 + 2)
            answer = RecallResponse.model_validate_json(reply.data)
            if answer.items or answer.degraded:
                return answer, True
            groups = await nc.request(subjects.GRAPH_GROUPS, GraphGroupsRequest().model_dump_json().encode(), timeout=10)
            return answer, bool(named & set(GraphGroupsResponse.model_validate_json(groups.data).group_ids))

    response, any_memory = asyncio.run(ask())
    if not any_memory:
        where = ", ".join(f"{k} {v!r}" for k, v in (("session", session), ("workspace", workspace), ("user", user))
                          if v) or "those groups"
        raise CliError(f"no memory in {where}: nothing was ever stored there (check the key; `engram status`, "
                       "or the explorer's group list, shows what exists)")
    if json_output:
        print_json(console, response.model_dump(mode="json"))
    else:
        plain(console, response.prompt_section
              or f"(no memory found{': ' + response.reason if response.reason else ''})")
        facts = sum(1 for item in response.items if item.kind == "fact")
        turns = len(response.items) - facts
        plain(console, f"{facts} {'fact' if facts == 1 else 'facts'}, {turns} past {'turn' if turns == 1 else 'turns'}"
                       f" in {response.took_ms:.1f} ms", style="dim")
    if response.degraded:
        error_line(err, f"recall degraded: {response.reason} (check the stack with `engram status`)")
        raise typer.Exit(1)


@app.command()
def context(
    session: Annotated[Optional[str], typer.Option(help="Session id (the publisher's session_id).")] = None,
    workspace: Annotated[Optional[str], typer.Option(help="Workspace key: its promoted memories (agent_memory).")] = None,
    user: Annotated[Optional[str], typer.Option(help="User key: whose preferences, notes and last session.")] = None,
    query: Annotated[Optional[str], typer.Option(help="The user's current message: the recall layer searches for it.")] = None,
    identity: Annotated[Optional[str], typer.Option(help="The agent's identity text (the identity layer).")] = None,
    skills: Annotated[Optional[str], typer.Option(help="The agent's skills text (the skills layer).")] = None,
    timeout_ms: Annotated[int, typer.Option(help="The context answers (maybe degraded) within this time.")] = 5000,
    json_output: Annotated[bool, typer.Option("--json", help="The ContextResponse as JSON.")] = False,
    data_dir: DataDir = None,
) -> None:
    """The layered context an agent injects: identity, agent_memory, user_context, session_summary,
    skills and recall, each within its ENGRAM_CONTEXT_BUDGET_* tokens.

    Exits 1 when a layer's source failed (degraded: the other layers are printed)."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import ContextRequest, ContextResponse, MemoryScopes

    if not (session or workspace or user or identity or skills):
        raise CliError("give at least one of --user, --workspace or --session: whose context to build "
                       "(see `engram context --help`)", code=2)
    try:
        request = ContextRequest(scopes=MemoryScopes(session=session, workspace=workspace, user=user), query=query,
                                 identity=identity, skills=skills, timeout_ms=timeout_ms)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"scopes.session": "--session", "session": "--session", "timeout_ms": "--timeout-ms"}) from exc
    settings = _settings(data_dir)

    async def ask() -> ContextResponse:
        async with nats_connection(settings) as nc:
            reply = await nc.request(subjects.CONTEXT, request.model_dump_json().encode(), timeout=timeout_ms / 1000 + 2)
        return ContextResponse.model_validate_json(reply.data)

    response = asyncio.run(ask())
    if response.status == "error":
        raise CliError(f"the context builder failed: {response.reason} (check the stack with `engram status`)")
    if json_output:
        print_json(console, response.model_dump(mode="json"))
    else:
        for section in response.sections:
            cut = ", cut to fit" if section.truncated else ""
            plain(console, f"── {section.layer}: {section.tokens}/{section.budget} tokens{cut} ({section.source})",
                  style="bold")
            plain(console, section.text)
        if not response.sections:
            plain(console, "(no context: nothing stored for these scopes yet)")
        plain(console, f"{len(response.sections)} layers, {response.tokens} tokens in {response.took_ms:.1f} ms",
              style="dim")
    if response.degraded:
        why = (response.reason or "").removeprefix("degraded: ")
        error_line(err, f"context degraded: {why} (check the stack with `engram status`)")
        raise typer.Exit(1)


def _memory_scopes(user: str | None, workspace: str | None, session: str | None):  # noqa: ANN202
    from engram.schemas.memory import MemoryScopes

    if not (user or workspace or session):
        raise CliError("give --user, --workspace or --session: whose memory (see `engram memory --help`)", code=2)
    return MemoryScopes(user=user, workspace=workspace, session=session)


def _ask_memory(data_dir: Path | None, subject: str, request):  # noqa: ANN001, ANN202
    from engram.schemas.memory import MemoryResponse

    settings = _settings(data_dir)

    async def ask() -> MemoryResponse:
        async with nats_connection(settings) as nc:
            reply = await nc.request(subject, request.model_dump_json().encode(), timeout=10)
        return MemoryResponse.model_validate_json(reply.data)

    response = asyncio.run(ask())
    if response.status == "error":
        raise CliError(f"the sessions service failed: {response.reason}")
    return response


MemoryUser = Annotated[Optional[str], typer.Option(help="User key (the memory is the user's when given).")]
MemoryWorkspace = Annotated[Optional[str], typer.Option(help="Workspace key (when no --user).")]
MemorySession = Annotated[Optional[str], typer.Option(help="Session id (when neither).")]


@memory_app.command("prefs")
def memory_prefs(user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                 history: Annotated[bool, typer.Option("--history", help="Also earlier and removed values.")] = False,
                 json_output: Annotated[bool, typer.Option("--json", help="JSON for scripts.")] = False,
                 data_dir: DataDir = None) -> None:
    """The stored preferences (the latest value of each key)."""
    from engram.schemas import subjects
    from engram.schemas.memory import GetUserPreferencesRequest

    scopes = _memory_scopes(user, workspace, session)
    response = _ask_memory(data_dir, subjects.MEMORY_PREFERENCE_GET,
                           GetUserPreferencesRequest(scopes=scopes, include_history=history))
    if json_output:
        print_json(console, [p.model_dump(mode="json") for p in response.preferences])
        return
    table = Table(title=f"{len(response.preferences)} preferences")
    for col in ("key", "value", "source", "set", "current"):
        table.add_column(col)
    for p in response.preferences:
        table.add_row(Text(p.key), Text(p.value), p.source, p.set_at.isoformat(timespec="seconds"), "yes" if p.current else "no")
    print_table(console, table)


@memory_app.command("set")
def memory_set(key: Annotated[str, typer.Argument(help="The preference's key, e.g. language.")],
               value: Annotated[str, typer.Argument(help="Its value; the latest wins, earlier ones stay as history.")],
               user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
               data_dir: DataDir = None) -> None:
    """Set a preference (as an agent's set_user_preference tool does)."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import SetUserPreferenceRequest

    scopes = _memory_scopes(user, workspace, session)
    try:
        request = SetUserPreferenceRequest(scopes=scopes, key=key, value=value)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"key": "KEY", "value": "VALUE"}) from exc
    preference = _ask_memory(data_dir, subjects.MEMORY_PREFERENCE_SET, request).preference
    plain(console, f"set {preference.key if preference else key}")


@memory_app.command("unset")
def memory_unset(key: Annotated[str, typer.Argument(help="The preference's key.")],
                 user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                 data_dir: DataDir = None) -> None:
    """Remove a preference's current value (it stays in the history); exits 1 when it has none."""
    from engram.schemas import subjects
    from engram.schemas.memory import RemoveUserPreferenceRequest

    scopes = _memory_scopes(user, workspace, session)
    response = _ask_memory(data_dir, subjects.MEMORY_PREFERENCE_REMOVE, RemoveUserPreferenceRequest(scopes=scopes, key=key))
    if response.status == "not_found":
        raise CliError(f"no current value for {key!r} (see `engram memory prefs --history`)")
    plain(console, f"removed {key}")


@memory_app.command("note")
def memory_note(text: Annotated[str, typer.Argument(help="What to remember about the user.")],
                user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                data_dir: DataDir = None) -> None:
    """Save a note (as an agent's save_user_note tool does)."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import SaveUserNoteRequest

    scopes = _memory_scopes(user, workspace, session)
    try:
        request = SaveUserNoteRequest(scopes=scopes, text=text)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"text": "TEXT"}) from exc
    note = _ask_memory(data_dir, subjects.MEMORY_NOTE_SAVE, request).note
    plain(console, f"saved note {note.uuid if note else '?'}")


@memory_app.command("notes")
def memory_notes(user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                 limit: Annotated[int, typer.Option(help="Notes at most, newest first.")] = 50,
                 json_output: Annotated[bool, typer.Option("--json", help="JSON for scripts.")] = False,
                 data_dir: DataDir = None) -> None:
    """The stored notes, newest first."""
    from engram.schemas import subjects
    from engram.schemas.memory import ListUserNotesRequest

    scopes = _memory_scopes(user, workspace, session)
    notes = _ask_memory(data_dir, subjects.MEMORY_NOTES_LIST, ListUserNotesRequest(scopes=scopes, limit=limit)).notes
    if json_output:
        print_json(console, [n.model_dump(mode="json") for n in notes])
        return
    for n in notes:
        plain(console, f"{n.created_at.isoformat(timespec='seconds')} [{n.source}] {n.text}")
    plain(console, f"{len(notes)} notes", style="dim")


@memory_app.command("activity")
def memory_activity(text: Annotated[str, typer.Argument(help="What was done for the user, e.g. 'searched: Python tutorials'.")],
                    kind: Annotated[str, typer.Option(help="What sort of activity (lowercase), e.g. search, tool.")] = "activity",
                    activity_id: Annotated[Optional[str], typer.Option("--id", help="Your id for the entry: logging it again logs it once.")] = None,
                    user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                    data_dir: DataDir = None) -> None:
    """Log an activity (as an agent's log_activity tool does)."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import LogActivityRequest

    scopes = _memory_scopes(user, workspace, session)
    try:
        request = LogActivityRequest(scopes=scopes, text=text, kind=kind, activity_id=activity_id)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"text": "TEXT", "kind": "--kind", "activity_id": "--id"}) from exc
    activity = _ask_memory(data_dir, subjects.MEMORY_ACTIVITY_LOG, request).activity
    plain(console, f"logged activity {activity.uuid if activity else '?'}")


@memory_app.command("activities")
def memory_activities(user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                      limit: Annotated[int, typer.Option(help="Entries at most, newest first.")] = 50,
                      kind: Annotated[Optional[str], typer.Option(help="Only entries of this kind.")] = None,
                      json_output: Annotated[bool, typer.Option("--json", help="JSON for scripts.")] = False,
                      data_dir: DataDir = None) -> None:
    """The activity log, newest first."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import ListActivitiesRequest

    scopes = _memory_scopes(user, workspace, session)
    try:
        request = ListActivitiesRequest(scopes=scopes, limit=limit, kind=kind)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"limit": "--limit", "kind": "--kind"}) from exc
    activities = _ask_memory(data_dir, subjects.MEMORY_ACTIVITIES_LIST, request).activities
    if json_output:
        print_json(console, [a.model_dump(mode="json") for a in activities])
        return
    for a in activities:
        plain(console, f"{a.occurred_at.isoformat(timespec='seconds')} {a.kind}: {a.text}  ({a.uuid})")
    plain(console, f"{len(activities)} activities", style="dim")


@memory_app.command("remove-activity")
def memory_remove_activity(uuid: Annotated[str, typer.Argument(help="The entry's uuid (see `engram memory activities`).")],
                           user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                           data_dir: DataDir = None) -> None:
    """Delete one activity log entry; exits 1 when there is none with this uuid."""
    from engram.schemas import subjects
    from engram.schemas.memory import DeleteActivityRequest

    scopes = _memory_scopes(user, workspace, session)
    response = _ask_memory(data_dir, subjects.MEMORY_ACTIVITY_DELETE, DeleteActivityRequest(scopes=scopes, uuid=uuid))
    if response.status == "not_found":
        raise CliError(f"no activity {uuid} in this memory (see `engram memory activities`)")
    plain(console, f"removed activity {uuid}")


@memory_app.command("favorite")
def memory_favorite(item: Annotated[str, typer.Argument(help="The item: a title, a link, a name.")],
                    kind: Annotated[Optional[str], typer.Option(help="What sort of item (lowercase), e.g. doc, repo.")] = None,
                    user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                    data_dir: DataDir = None) -> None:
    """Add a favorite (as an agent's add_favorite tool does)."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import AddFavoriteRequest

    scopes = _memory_scopes(user, workspace, session)
    try:
        request = AddFavoriteRequest(scopes=scopes, item=item, kind=kind)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"item": "ITEM", "kind": "--kind"}) from exc
    favorite = _ask_memory(data_dir, subjects.MEMORY_FAVORITE_ADD, request).favorite
    plain(console, f"saved favorite {favorite.uuid if favorite else '?'}")


@memory_app.command("favorites")
def memory_favorites(user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                     limit: Annotated[int, typer.Option(help="Favorites at most, newest first.")] = 100,
                     json_output: Annotated[bool, typer.Option("--json", help="JSON for scripts.")] = False,
                     data_dir: DataDir = None) -> None:
    """The favorites, newest first."""
    from pydantic import ValidationError

    from engram.schemas import subjects
    from engram.schemas.memory import ListFavoritesRequest

    scopes = _memory_scopes(user, workspace, session)
    try:
        request = ListFavoritesRequest(scopes=scopes, limit=limit)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"limit": "--limit"}) from exc
    favorites = _ask_memory(data_dir, subjects.MEMORY_FAVORITES_LIST, request).favorites
    if json_output:
        print_json(console, [f.model_dump(mode="json") for f in favorites])
        return
    for f in favorites:
        kind = f" ({f.kind})" if f.kind else ""
        plain(console, f"{f.added_at.isoformat(timespec='seconds')} {f.item}{kind}  ({f.uuid})")
    plain(console, f"{len(favorites)} favorites", style="dim")


@memory_app.command("remove-favorite")
def memory_remove_favorite(uuid: Annotated[str, typer.Argument(help="The favorite's uuid (see `engram memory favorites`).")],
                           user: MemoryUser = None, workspace: MemoryWorkspace = None, session: MemorySession = None,
                           data_dir: DataDir = None) -> None:
    """Remove one favorite; exits 1 when there is none with this uuid."""
    from engram.schemas import subjects
    from engram.schemas.memory import RemoveFavoriteRequest

    scopes = _memory_scopes(user, workspace, session)
    response = _ask_memory(data_dir, subjects.MEMORY_FAVORITE_REMOVE, RemoveFavoriteRequest(scopes=scopes, uuid=uuid))
    if response.status == "not_found":
        raise CliError(f"no favorite {uuid} in this memory (see `engram memory favorites`)")
    plain(console, f"removed favorite {uuid}")


@app.command()
def doctor(
    smoke: Annotated[bool, typer.Option("--smoke", help="Also write to a temporary group, read it back, delete it.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Check every part of engram (and, with --smoke, one message through the whole pipeline)."""
    from dataclasses import asdict

    from engram.cli.doctor import run_checks

    settings = _settings(data_dir)
    checks = asyncio.run(run_checks(settings, smoke=smoke))
    if json_output:
        print_json(console, [asdict(c) for c in checks])
    else:
        table = Table(title="engram doctor")
        for col in ("check", "status", "detail", "ms"):
            table.add_column(col, justify="right" if col == "ms" else "left")
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            table.add_row(c.name, Text(c.status, style=colour[c.status]), Text(c.detail), f"{c.took_ms:.0f}")
        print_table(console, table)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        first = f"{failed[0].name}: {failed[0].detail}"
        if failed[0].name.startswith("nats"):  # nothing else was checked: say how to get a stack
            try:
                first = unreachable(settings, nats_url_or_fail(settings), failed[0].detail)
            except CliError as exc:
                first = str(exc)
        error_line(err, f"{len(failed)} of {len(checks)} checks failed: {first}")
    raise typer.Exit(1 if failed else 0)


@app.command()
def promote(
    text: Annotated[str, typer.Argument(help="The decision, lesson, preference or procedure, in plain words.")],
    kind: Annotated[str, typer.Option(help="decision | lesson_learned | preference | procedure | task_update | "
                                           "repo_state (the last two: --workspace only)")] = "decision",
    workspace: Annotated[Optional[str], typer.Option(help="Store in this workspace's scope (its key).")] = None,
    user: Annotated[Optional[str], typer.Option(help="Store in this user's scope (its key).")] = None,
    rationale: Annotated[Optional[str], typer.Option(help="Why (kept with it).")] = None,
    author: Annotated[Optional[str], typer.Option(help="Who said it.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Store a durable memory in the workspace or user scope (extracted like a turn)."""
    from pydantic import ValidationError

    from engram.publishing.promote import Promotion, publish_promotion

    if (workspace is None) == (user is None):
        raise CliError("give exactly one of --workspace KEY or --user KEY: the scope to store it in "
                       "(see `engram promote --help`)", code=2)
    try:
        promotion = Promotion(kind=kind, text=text, scope="workspace" if workspace else "user",  # type: ignore[arg-type]
                              key=workspace or user, rationale=rationale, author=author)
    except ValidationError as exc:
        raise _bad_parameter(exc, {"text": "TEXT", "key": "--workspace" if workspace else "--user"}) from exc
    settings = _settings(data_dir)

    async def send():  # noqa: ANN202
        async with nats_connection(settings) as nc:
            return await publish_promotion(nc.jetstream(), promotion, settings.group_prefix)

    episode = asyncio.run(send())
    plain(console, f"stored {promotion.kind} in {promotion.scope} scope: group {episode.group_id}, "
                   f"episode {episode.episode_id}")


INGEST_SKIPPED_EXIT = 3
"""`engram ingest` exit code when invalid lines were skipped and the rest was imported."""


@app.command()
def ingest(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or locomo.")] = "jsonl",
    workspace: Annotated[Optional[str], typer.Option(help="Workspace key (also written to that scope).")] = None,
    user: Annotated[Optional[str], typer.Option(help="User key (also written to that scope).")] = None,
    sample: Annotated[Optional[list[str]], typer.Option(help="LoCoMo sample id(s), e.g. conv-26; default all.")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Refuse the whole file (publish nothing) when any line is invalid.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Publish a transcript (one message per line, or LoCoMo JSON) into engram.

    A JSONL line that is not a valid message, or holds one larger than engram takes
    (ENGRAM_TURN_MAX_MESSAGE_BYTES, or the NATS server's max_payload), is reported with its line
    number and reason and left out; the other lines are imported and the exit code is 3. With --strict nothing is
    published when any line is invalid (exit 2). Ingesting the same file again is safe: what
    engram already has is not stored twice."""
    from pydantic import ValidationError
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engram.cli.support import explain
    from engram.publishing.ingest import SkippedLine, TranscriptError, publish_events, read_transcript
    from engram.schemas import ChatMessage, ScopeKeys

    if fmt not in ("jsonl", "locomo"):
        raise typer.BadParameter("must be jsonl or locomo", param_hint="'--format'")
    try:
        scopes = ScopeKeys(workspace=workspace, user=user)
    except ValidationError as exc:
        raise _bad_parameter(exc, {}) from exc
    settings = _settings(data_dir)
    skipped: list[SkippedLine] = []
    linenos: dict[tuple[str, str], int] = {}
    try:
        events = read_transcript(path, fmt, scopes, sample or (), skipped=skipped,  # type: ignore[arg-type]
                                 max_bytes=settings.turn.max_message_bytes, linenos=linenos)
    except TranscriptError as exc:
        raise CliError(f"cannot read transcript: {exc}", code=2) from exc
    for line in skipped:
        plain(err, f"{path}:{line.lineno}: {'invalid' if strict else 'skipped'}: {line.reason}", style="yellow")
    if skipped and strict:
        raise CliError(f"{path}: {len(skipped)} invalid {'line' if len(skipped) == 1 else 'lines'} (listed above): "
                       "nothing published (--strict); fix them, or drop --strict to import the valid lines", code=2)
    if not any(isinstance(e, ChatMessage) for e in events):
        raise CliError(f"nothing to ingest: no valid message in {path}"
                       + (f" for sample(s) {', '.join(sample)}" if sample else ""))

    sent = 0
    too_big: list[SkippedLine] = []

    def left_out(message: ChatMessage, reason: str) -> None:  # larger than the server's max_payload
        line = SkippedLine(linenos.get((message.session_id, message.message_id), 0), reason)
        too_big.append(line)
        plain(err, f"{path}:{line.lineno}: skipped: {reason}", style="yellow")

    def advance(progress: Progress, task: object) -> None:
        nonlocal sent
        sent += 1
        progress.advance(task)  # type: ignore[arg-type]

    async def run() -> object:
        from engram.observability import tracing

        tracing.provider_for(settings.otel_endpoint, "ingest")  # one trace per turn when ENGRAM_OTEL_ENDPOINT is set
        try:
            return await publish()
        finally:
            tracing.shutdown()  # export the publish spans before exiting

    async def publish() -> object:
        async with nats_connection(settings, name="engram-ingest") as nc:
            with Progress(TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=False) as progress:
                task = progress.add_task("publish", total=len(events))
                try:
                    return await publish_events(nc.jetstream(), events, lambda: advance(progress, task),
                                                too_big=left_out)
                except Exception as exc:  # noqa: BLE001 - said in one line, with how to resume
                    raise CliError(f"publishing stopped after {sent} of {len(events)} events: {explain(exc)}; running "
                                   "the same ingest again is safe (what engram already has is not stored twice)") from exc

    report = asyncio.run(run())
    plain(console,
          f"published {report.messages}, already present {report.duplicates} messages "  # type: ignore[attr-defined]
          f"in {report.sessions} sessions ({report.closes} session closes)")  # type: ignore[attr-defined]
    skipped += too_big
    if skipped:
        error_line(err, f"{path}: skipped {len(skipped)} invalid {'line' if len(skipped) == 1 else 'lines'} (listed "
                        "above); every other line was imported (use --strict to refuse the file instead)")
        raise typer.Exit(INGEST_SKIPPED_EXIT)


DLQ_COLUMNS = ("seq", "stage", "reason", "detail", "subject", "time", "bytes")
DLQ_STAGE_HELP = "Only this stage: turn_detector, extractor, summary_gate or sessions."


def _known_dlq_stage(value: Optional[str]) -> Optional[str]:
    # engram.dlq is imported here, not at the top: every other command would pay for its imports
    from engram.runtime.dlq import STAGES

    if value is not None and value not in STAGES:
        raise typer.BadParameter(f"{value!r} is not a stage that dead-letters; use one of {', '.join(STAGES)}")
    return value


DlqStage = Annotated[Optional[str], typer.Option(help=DLQ_STAGE_HELP, callback=_known_dlq_stage)]


@dlq_app.command("list")
def dlq_list(
    stage: DlqStage = None,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON array of dead letters (for scripts).")] = False,
    data_dir: DataDir = None,
) -> None:
    """List dead letters with their reasons (content is never printed)."""
    from engram.runtime.dlq import list_dead_letters

    settings = _settings(data_dir)

    async def run() -> list:
        async with nats_connection(settings) as nc:
            return await list_dead_letters(nc.jetstream(), stage)

    letters = asyncio.run(run())
    rows = [
        {"seq": d.seq, "stage": d.stage, "reason": d.reason, "detail": d.detail, "subject": d.subject,
         "time": d.time, "bytes": d.size}
        for d in letters
    ]
    if json_output:
        print_json(console, rows)
        return
    table = Table(title=f"{len(rows)} dead letters")
    for col in DLQ_COLUMNS:
        table.add_column(col, justify="right" if col in ("seq", "bytes") else "left")
    for r in rows:
        table.add_row(*(Text(str(r[c])) for c in DLQ_COLUMNS))
    print_table(console, table)


@dlq_app.command("replay")
def dlq_replay(
    stage: DlqStage = None,
    data_dir: DataDir = None,
) -> None:
    """Re-publish dead letters to their original subjects (e.g. after fixing a bug)."""
    from engram.runtime.dlq import replay_dead_letters

    settings = _settings(data_dir)

    async def run() -> int:
        async with nats_connection(settings) as nc:
            return await replay_dead_letters(nc, stage)

    plain(console, f"replayed {asyncio.run(run())} dead letters")


@app.command()
def demo(
    data_dir: Annotated[Optional[Path], typer.Option(
        "--data-dir",
        help="A new or empty directory for the demo's own throw-away stack (default ./.engram/demo). "
        "The demo marks directories it creates and only ever deletes those: it refuses a non-empty "
        "directory it did not create.",
    )] = None,
    locomo: Annotated[Optional[Path], typer.Option(
        exists=True, dir_okay=False, readable=True,
        help="LoCoMo JSON to ingest as well (conversation conv-26); by default ../shared/data/locomo/locomo7.json "
        "when it is there.")] = None,
) -> None:
    """Start engram, ingest a sample conversation, show the turns it built, stop."""
    from engram.cli.demo import DEFAULT_DEMO_DIR, run_demo

    raise typer.Exit(run_demo(_settings(data_dir or DEFAULT_DEMO_DIR, find_running=False), locomo, console))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    app()

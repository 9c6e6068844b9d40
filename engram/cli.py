"""The `engram` command (Typer + Rich). Users' scripts depend on it: keep it stable."""

from __future__ import annotations

import asyncio
import json
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from engram.settings import EngramSettings  # noqa: E402

app = typer.Typer(help="engram: conversation memory for agents over NATS.", no_args_is_help=True)
dlq_app = typer.Typer(help="Inspect and replay dead letters.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")
console = Console()
err = Console(stderr=True)

DataDir = Annotated[
    Optional[Path], typer.Option("--data-dir", help="Where embedded servers keep data (default ~/.local/share/engram).")
]


def _settings(data_dir: Path | None = None) -> EngramSettings:
    if data_dir is not None:
        return EngramSettings(data_dir=data_dir.expanduser().resolve())
    return EngramSettings()


class Service(str, Enum):
    turn_detector = "turn-detector"
    extractor = "extractor"
    summary_gate = "summary-gate"
    recall = "recall"
    gateway = "gateway"


SERVICE_MODULES = {
    Service.turn_detector: "services.turn_detector.app",
    Service.extractor: "services.extractor.app",
    Service.summary_gate: "services.summary_gate.app",
    Service.recall: "services.recall.app",
    Service.gateway: "services.gateway.app",
}


@app.command()
def up(data_dir: DataDir = None) -> None:
    """Start NATS, FalkorDB and every service; Ctrl-C stops everything."""
    from engram.service import configure_logging
    from engram.supervisor import run_up

    settings = _settings(data_dir)
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
        console.print(table)
        console.print(f"data: {settings.data_dir}   logs: {settings.data_dir / 'logs'}   Ctrl-C to stop")

    try:
        code = asyncio.run(run_up(settings, on_ready=ready))
    except RuntimeError as exc:
        err.print(f"[red]engram up failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    console.print("engram stopped")
    raise typer.Exit(code)


@app.command()
def serve(service: Service, data_dir: DataDir = None) -> None:
    """Run one service in the foreground (what `engram up`, compose and Kubernetes run)."""
    import importlib

    from engram.service import configure_logging

    settings = _settings(data_dir)
    configure_logging(settings.log_level)
    module = importlib.import_module(SERVICE_MODULES[service])
    service_app = module.build(settings)
    asyncio.run(
        service_app.asgi().run(
            run_extra_options={"host": settings.http_host, "port": settings.http_port, "access_log": "false"}
        )
    )


@app.command()
def status(json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
           data_dir: DataDir = None) -> None:
    """Health of each part, stream and consumer backlog, counts of messages, turns, episodes."""
    from engram.status import collect_status

    result = asyncio.run(collect_status(_settings(data_dir)))
    if json_output:
        console.print_json(json.dumps(result))
    else:
        _print_status(result)
    raise typer.Exit(0 if result.get("ok") else 1)


def _print_status(result: dict) -> None:
    parts = Table(title="parts")
    for col in ("part", "ok", "url / detail"):
        parts.add_column(col)
    for name, p in result["parts"].items():
        parts.add_row(name, "[green]yes[/]" if p.get("ok") else "[red]no[/]", str(p.get("url") or p.get("detail")))
    for name, s in result.get("services", {}).items():
        parts.add_row(name, "[green]yes[/]" if s["ok"] else "[red]no[/]", s["url"])
    console.print(parts)
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
    console.print(streams)
    counts = Table(title="counts")
    counts.add_column("what")
    counts.add_column("n", justify="right")
    for k, v in result.get("counts", {}).items():
        counts.add_row(k, str(v))
    console.print(counts)
    if result.get("summary_gate"):
        from engram.status import summary_gate_table

        console.print(summary_gate_table(result["summary_gate"]))


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
    json_output: Annotated[bool, typer.Option("--json", help="The RecallResponse as JSON.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Ask engram's recall service for memory about QUERY across session, workspace and user scopes."""
    import nats

    from schemas import RecallRequest, RecallResponse, RecallScopes, subjects

    settings = _settings(data_dir)
    request = RecallRequest(
        query=query, scopes=RecallScopes(session=session, workspace=workspace, user=user), group_ids=group or [],
        max_facts=max_facts, token_budget=token_budget, timeout_ms=timeout_ms,
    )

    async def ask() -> RecallResponse:
        nc = await nats.connect(settings.resolved_nats_url(), **settings.nats_options())
        try:
            reply = await nc.request(subjects.RECALL, request.model_dump_json().encode(), timeout=timeout_ms / 1000 + 2)
        finally:
            await nc.close()
        return RecallResponse.model_validate_json(reply.data)

    try:
        response = asyncio.run(ask())
    except Exception as exc:  # noqa: BLE001
        err.print(f"[red]recall failed:[/red] {type(exc).__name__}: {exc} (is `engram up` running?)")
        raise typer.Exit(1) from exc
    if json_output:
        console.print_json(response.model_dump_json())
        return
    if response.degraded:
        err.print(f"[yellow]recall degraded:[/yellow] {response.reason}")
    console.print(response.prompt_section or f"(no memory found{': ' + response.reason if response.reason else ''})",
                  markup=False, highlight=False)
    console.print(f"{len(response.items)} facts in {response.took_ms:.1f} ms", style="dim")


@app.command()
def doctor(
    smoke: Annotated[bool, typer.Option("--smoke", help="Also write to a temporary group, read it back, delete it.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Check every part of engram (and, with --smoke, one message through the whole pipeline)."""
    from dataclasses import asdict

    from engram.doctor import run_checks

    checks = asyncio.run(run_checks(_settings(data_dir), smoke=smoke))
    if json_output:
        console.print_json(json.dumps([asdict(c) for c in checks]))
    else:
        table = Table(title="engram doctor")
        for col in ("check", "status", "detail", "ms"):
            table.add_column(col, justify="right" if col == "ms" else "left")
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail, f"{c.took_ms:.0f}")
        console.print(table)
    raise typer.Exit(1 if any(c.status == "fail" for c in checks) else 0)


@app.command()
def promote(
    text: Annotated[str, typer.Argument(help="The decision, lesson, preference or procedure, in plain words.")],
    kind: Annotated[str, typer.Option(help="decision | lesson_learned | preference | procedure")] = "decision",
    workspace: Annotated[Optional[str], typer.Option(help="Store in this workspace's scope (its key).")] = None,
    user: Annotated[Optional[str], typer.Option(help="Store in this user's scope (its key).")] = None,
    rationale: Annotated[Optional[str], typer.Option(help="Why (kept with it).")] = None,
    author: Annotated[Optional[str], typer.Option(help="Who said it.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Store a durable memory in the workspace or user scope (extracted like a turn)."""
    import nats
    from pydantic import ValidationError

    from engram.promote import Promotion, publish_promotion

    if (workspace is None) == (user is None):
        raise typer.BadParameter("give exactly one of --workspace KEY or --user KEY")
    try:
        promotion = Promotion(kind=kind, text=text, scope="workspace" if workspace else "user",  # type: ignore[arg-type]
                              key=workspace or user, rationale=rationale, author=author)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"]) from exc
    settings = _settings(data_dir)

    async def send():  # noqa: ANN202
        nc = await nats.connect(settings.resolved_nats_url(), **settings.nats_options())
        try:
            return await publish_promotion(nc.jetstream(), promotion, settings.group_prefix)
        finally:
            await nc.close()

    episode = asyncio.run(send())
    console.print(f"stored {promotion.kind} in {promotion.scope} scope: group {episode.group_id}, episode {episode.episode_id}")


@app.command()
def ingest(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or locomo.")] = "jsonl",
    workspace: Annotated[Optional[str], typer.Option(help="Workspace key (also written to that scope).")] = None,
    user: Annotated[Optional[str], typer.Option(help="User key (also written to that scope).")] = None,
    sample: Annotated[Optional[list[str]], typer.Option(help="LoCoMo sample id(s), e.g. conv-26; default all.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Publish a transcript (one message per line, or LoCoMo JSON) into engram."""
    import nats
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engram.ingest import TranscriptError, publish_events, read_transcript
    from schemas import ScopeKeys

    if fmt not in ("jsonl", "locomo"):
        raise typer.BadParameter("--format must be jsonl or locomo")
    settings = _settings(data_dir)
    try:
        events = read_transcript(path, fmt, ScopeKeys(workspace=workspace, user=user), sample or ())  # type: ignore[arg-type]
    except TranscriptError as exc:
        err.print(f"[red]cannot read transcript:[/red] {exc}")
        raise typer.Exit(2) from exc
    if not events:
        err.print("[yellow]nothing to ingest[/yellow] (no messages matched)")
        raise typer.Exit(1)

    async def run() -> object:
        nc = await nats.connect(settings.resolved_nats_url(), name="engram-ingest", **settings.nats_options())
        try:
            with Progress(TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=False) as progress:
                task = progress.add_task("publish", total=len(events))
                return await publish_events(nc.jetstream(), events, lambda: progress.advance(task))
        finally:
            await nc.close()

    try:
        report = asyncio.run(run())
    except RuntimeError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    console.print(
        f"published {report.messages}, already present {report.duplicates} messages "  # type: ignore[attr-defined]
        f"in {report.sessions} sessions ({report.closes} session closes)"  # type: ignore[attr-defined]
    )


@dlq_app.command("list")
def dlq_list(
    stage: Annotated[Optional[str], typer.Option(help="Only this stage, e.g. turn_detector.")] = None,
    json_output: Annotated[bool, typer.Option("--json")] = False,
    data_dir: DataDir = None,
) -> None:
    """List dead letters with their reasons (content is never printed)."""
    import nats

    from engram.dlq import list_dead_letters

    settings = _settings(data_dir)

    async def run() -> list:
        nc = await nats.connect(settings.resolved_nats_url(), **settings.nats_options())
        try:
            return await list_dead_letters(nc.jetstream(), stage)
        finally:
            await nc.close()

    letters = asyncio.run(run())
    rows = [
        {"seq": d.seq, "stage": d.stage, "reason": d.reason, "detail": d.detail, "subject": d.subject,
         "time": d.time, "bytes": d.size}
        for d in letters
    ]
    if json_output:
        console.print_json(json.dumps(rows))
        return
    table = Table(title=f"{len(rows)} dead letters")
    for col in ("seq", "stage", "reason", "detail", "subject", "time", "bytes"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(str(r[c]) for c in ("seq", "stage", "reason", "detail", "subject", "time", "bytes")))
    console.print(table)


@dlq_app.command("replay")
def dlq_replay(
    stage: Annotated[Optional[str], typer.Option(help="Only this stage.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Re-publish dead letters to their original subjects (e.g. after fixing a bug)."""
    import nats

    from engram.dlq import replay_dead_letters

    settings = _settings(data_dir)

    async def run() -> int:
        nc = await nats.connect(settings.resolved_nats_url(), **settings.nats_options())
        try:
            return await replay_dead_letters(nc, stage)
        finally:
            await nc.close()

    console.print(f"replayed {asyncio.run(run())} dead letters")


@app.command()
def demo(
    data_dir: Annotated[Optional[Path], typer.Option(
        "--data-dir",
        help="A new or empty directory for the demo's own throw-away stack (default ./.engram/demo). "
        "The demo marks directories it creates and only ever deletes those: it refuses a non-empty "
        "directory it did not create.",
    )] = None,
    locomo: Annotated[Optional[Path], typer.Option(help="LoCoMo JSON to ingest as well (one conversation).")] = None,
) -> None:
    """Start engram, ingest a sample conversation, show the turns it built, stop."""
    from engram.demo import DEFAULT_DEMO_DIR, run_demo

    raise typer.Exit(run_demo(_settings(data_dir or DEFAULT_DEMO_DIR), locomo, console))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    app()

"""Isolation of the session layer (issue 16, item 4): no ``/context`` or ``/memory/*`` view of one
user's, workspace's or session's memory ever returns a note, preference, session summary or
context section item of another.

The stack of tests/services/test_isolation.py (tests/support/stack.py) plus the sessions service,
whose prompts the offline rules model answers. Per run (``ENGRAM_ISOLATION_EXAMPLES`` examples,
default 20 in CI):

* 10 users, each with two conversations (``ScopeKeys(user=...)``; the second also names the
  user's workspace: 4 workspaces, each shared by two users), 2 conversations naming only a
  workspace (2 more workspaces) and 2 naming only their session: 24 conversations published at
  once and closed (``SessionClosed``), so the turn-detector closes 24 segments and the sessions
  service writes a summary, and the preferences and notes the rules model extracts ("My favourite
  band is X", "Call me N", self statements), to each conversation's memory group (the user's,
  else the workspace's, else the session's);
* meanwhile, notes saved and preferences set for every user, workspace and session-only
  conversation, half through the gateway (``POST /memory/notes``, ``PUT /memory/preferences/{key}``)
  and half straight on ``engram.memory.note.save`` / ``engram.memory.preference.set``, all at once,
  one preference replaced (history), and one promotion per shared workspace (``POST /promote``, the
  context's agent_memory layer);
* every user, workspace and conversation names people, a company, a project, a band, ... no one
  else names, and all talk about "Paris", "the deploy", "the pipeline" (the bait).

The truth is read from FalkorDB: each memory group's ``EngramNote`` uuids and texts,
``EngramPreference`` (key, value, set_at), ``EngramSession`` (segment id, session, summary).
Every returned item is checked twice: it is one of the asked memory group's (by uuid, by
(key, value, set_at), by segment id and summary), and its text names nobody another group owns.
The views, for a viewer drawn by hypothesis (a user, a user with their workspace, a user with one
of their sessions, a workspace alone, a session alone) and a query from every conversation's words:

* ``POST /context``: user_context (each preference and note line), session_summary (its source's
  session and segment, its text), agent_memory and recall (the groups the scopes name: the
  recall section may hold the workspace's and the session's turns, never another's);
* ``GET /memory/notes``, ``GET /memory/preferences`` (current, and with history),
  ``GET /memory/sessions``; and ``engram.context`` / ``engram.memory.notes.list`` over NATS;
* ``DELETE /memory/notes/{uuid}`` of another group's note through the viewer's scope: 404, and
  the note is still its owner's.

Also: the views asked while the segments were being closed; and the sessions service's own view
of a group, the previous summaries it puts in a summary prompt, only ever hold that group's.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from falkordb.asyncio import FalkorDB
from graphiti_core.llm_client.config import ModelSize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram.publishing.ingest import publish_events
from engram.models.rules_llm import RulesExtractorClient
from engram.schemas import ChatMessage, ScopeKeys, SessionClosed, subjects
from engram.schemas.memory import (
    ContextResponse,
    ListUserNotesRequest,
    MemoryResponse,
    MemoryScopes,
    SaveUserNoteRequest,
    SetUserPreferenceRequest,
    memory_group_for,
)
from engram.services.sessions.store import NOTE, PREFERENCE, SESSION
from engram.services.turn_detector.pairing import scope_groups
from tests.support.names import SHARED_WORDS, unique_names
from tests.support.stack import IsolationStack

pytestmark = pytest.mark.slow

USERS = 10
SHARED_WORKSPACES = 4  # workspace k is shared by users 2k and 2k+1
LONE_WORKSPACES = 2  # workspaces whose conversation names no user
SESSION_ONLY = 2  # conversations naming only their session
EXAMPLES = int(os.environ.get("ENGRAM_ISOLATION_EXAMPLES", "20"))
T0 = datetime(2026, 3, 2, 9, tzinfo=timezone.utc)
BUDGETS = {"user_context": 4000, "session_summary": 2000, "recall": 2000, "agent_memory": 2000}


class RecordingRules(RulesExtractorClient):
    """The rules model, keeping the sessions service's prompts (what it showed the model of a group)."""

    def __init__(self) -> None:
        super().__init__()
        self.summary_prompts: list[str] = []

    async def generate_response(self, messages: list[Any], response_model: Any = None, max_tokens: int | None = None,
                                model_size: ModelSize = ModelSize.medium, group_id: str | None = None,
                                prompt_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        if prompt_name == "sessions.summary":
            self.summary_prompts.append(messages[-1].content)
        return await super().generate_response(messages, response_model, max_tokens, model_size, group_id,
                                               prompt_name, **kwargs)


@dataclass
class Conversation:
    session_id: str
    user: str | None
    workspace: str | None
    speaker: str  # the user's name (ChatMessage.name)
    names: list[str]  # every unique name it says
    turns: list[tuple[str, str]]

    @property
    def scopes(self) -> ScopeKeys:
        return ScopeKeys(user=self.user, workspace=self.workspace)

    @property
    def words(self) -> list[str]:
        return sorted({w.strip(".,!?") for u, a in self.turns for w in (u + " " + a).split() if len(w) > 2})

    def events(self) -> list[ChatMessage | SessionClosed]:
        out: list[ChatMessage | SessionClosed] = []
        for t, (user, bot) in enumerate(self.turns):
            for k, (role, text) in enumerate((("user", user), ("assistant", bot))):
                out.append(ChatMessage(message_id=f"m{t}-{k}", session_id=self.session_id, role=role, content=text,
                                       timestamp=T0 + timedelta(minutes=t, seconds=k), scopes=self.scopes,
                                       name=self.speaker if role == "user" else None))
        out.append(SessionClosed(session_id=self.session_id, closed_at=T0 + timedelta(hours=1)))
        return out


@dataclass
class Write:
    """A note or preference saved through the API: whose memory, what, and the names it says."""

    scopes: MemoryScopes
    kind: str  # note | preference
    text: str  # the note, or the preference's value
    key: str = ""
    names: tuple[str, ...] = ()
    via: str = "http"  # http | nats


@dataclass
class Plan:
    prefix: str
    convs: list[Conversation]
    writes: list[Write]
    promotions: list[tuple[str, str, str]]  # (workspace key, text, name)
    users: list[str]
    workspaces: list[str]

    def memory_group(self, user: str | None = None, workspace: str | None = None, session: str | None = None) -> str:
        group = memory_group_for(self.prefix, user=user, workspace=workspace, session=session)
        assert group is not None
        return group


def plan(run: str, prefix: str) -> Plan:
    names = iter(unique_names(12 * USERS + 8 * (LONE_WORKSPACES + SESSION_ONLY) + 2 * SHARED_WORKSPACES, seed=1604))
    users = [f"user-{run}-{i}@example.com" for i in range(USERS)]
    workspaces = [f"/srv/ws-{run}-{k}" for k in range(SHARED_WORKSPACES + LONE_WORKSPACES)]
    convs: list[Conversation] = []
    writes: list[Write] = []
    for i, user in enumerate(users):
        person, friend, company, project, band, nick, tool, coffee, city, pet, mentor, club = (next(names) for _ in range(12))
        workspace = workspaces[i // 2] if i // 2 < SHARED_WORKSPACES else None
        convs.append(Conversation(f"mem-{run}-u{i}-a", user, None, person, [person, friend, company, project, band, nick], [
            (f"I'm a release engineer at {company} and the deploy of {project} failed in Paris. "
             f"My favourite band is {band}. Call me {nick}.",
             f"Paris in spring sounds great, {nick}. How is the {project} release going?"),
            (f"{friend} fixed the pipeline at {company}, so we ship the {project} release tomorrow.",
             f"Tell {friend} that the team in Berlin is ready for the deploy."),
        ]))
        convs.append(Conversation(f"mem-{run}-u{i}-b", user, workspace, person, [person, tool, coffee, company], [
            (f"I use {tool} for the deploy pipeline at {company}. My favourite coffee is {coffee}.",
             f"{tool} is a fine choice for the pipeline in Paris."),
            (f"The release failed again, so I need to fix the {tool} config before spring.",
             "Then the deploy can go out after the fix."),
        ]))
        scopes = MemoryScopes(user=user)
        writes += [
            Write(scopes, "note", f"{person} keeps the {project} runbook next to the coffee machine in Paris.",
                  names=(person, project)),
            Write(scopes, "note", f"{person}'s mentor {mentor} reviews every deploy of the pipeline.",
                  names=(person, mentor), via="nats"),
            Write(scopes, "preference", f"{city}", key="home_city", names=(city,)),
            # set twice: the first value stays in the history, ended by the second
            Write(scopes, "preference", f"the {pet} walk before the deploy", key="morning_routine", names=(pet,),
                  via="nats"),
            Write(scopes, "preference", f"coffee at the {club} club, then the deploy", key="morning_routine",
                  names=(club,)),
        ]
    for k in range(SHARED_WORKSPACES + LONE_WORKSPACES):
        team, channel = next(names), next(names)
        writes += [Write(MemoryScopes(workspace=workspaces[k]), "note",
                         f"The {team} team deploys the pipeline on Fridays from Paris.", names=(team,),
                         via="nats" if k % 2 else "http"),
                   Write(MemoryScopes(workspace=workspaces[k]), "preference", f"#{channel}-release",
                         key="release_channel", names=(channel,), via="http" if k % 2 else "nats")]
    for k in range(LONE_WORKSPACES):
        person, company, project, band = (next(names) for _ in range(4))
        convs.append(Conversation(f"mem-{run}-w{k}", None, workspaces[SHARED_WORKSPACES + k], person,
                                  [person, company, project, band], [
            (f"I'm the on-call engineer at {company} and the {project} deploy failed in Paris. "
             f"My favourite band is {band}.",
             f"Sorry to hear that. Is the {project} pipeline fixed?"),
            (f"The {project} release is fixed for spring.", "Good news for the team in Berlin."),
        ]))
    for k in range(SESSION_ONLY):
        person, company, project, note_name = (next(names) for _ in range(4))
        convs.append(Conversation(f"mem-{run}-s{k}", None, None, person, [person, company, project], [
            (f"I work at {company} and my favourite city is Paris. The {project} deploy failed.",
             f"The {project} pipeline needs a fix before the release."),
        ]))
        writes.append(Write(MemoryScopes(session=convs[-1].session_id), "note",
                            f"{note_name} owns the {project} pipeline this spring.", names=(note_name, project),
                            via="nats" if k % 2 else "http"))
    promotions = []
    for k in range(SHARED_WORKSPACES):
        decision = next(names)
        promotions.append((workspaces[k], f"We deploy {decision} from Paris after every failed release.", decision))
    return Plan(prefix, convs, writes, promotions, users, workspaces)


@dataclass
class MemoryTruth:
    """One memory group's session layer, read straight from FalkorDB."""

    notes: dict[str, str] = field(default_factory=dict)  # uuid -> text
    preferences: set[tuple[str, str, datetime]] = field(default_factory=set)  # (key, value, set_at)
    current: set[tuple[str, str]] = field(default_factory=set)
    sessions: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # segment_id -> (session, segment, summary)
    misplaced: list[str] = field(default_factory=list)  # items in this group's graph that name another group_id

    @property
    def texts(self) -> list[str]:
        return [*self.notes.values(), *(f"{k} {v}" for k, v, _ in self.preferences),
                *(s for _, _, s in self.sessions.values())]


def when(value: Any) -> datetime:
    out = datetime.fromisoformat(value) if isinstance(value, str) else value
    return out.astimezone(timezone.utc)


async def read_memory(db: FalkorDB, group: str) -> MemoryTruth:
    truth = MemoryTruth()
    if group not in set(await db.list_graphs()):
        return truth
    graph = db.select_graph(group)
    # an item whose group_id is another group's is not this group's truth (a view returning it fails)
    for uuid_, group_id, text in (await graph.ro_query(f"MATCH (n:{NOTE}) RETURN n.uuid, n.group_id, n.text")).result_set:
        if group_id != group:
            truth.misplaced.append(f"note of {group_id}")
            continue
        truth.notes[uuid_] = text
    rows = (await graph.ro_query(f"MATCH (p:{PREFERENCE}) RETURN p.key, p.value, p.set_at, p.current, p.group_id")).result_set
    for key, value, set_at, current, group_id in rows:
        if group_id != group:
            truth.misplaced.append(f"preference of {group_id}")
            continue
        truth.preferences.add((key, value, when(set_at)))
        if current:
            truth.current.add((key, value))
    rows = (await graph.ro_query(f"MATCH (s:{SESSION}) WHERE s.state = 'closed' "
                                 "RETURN s.segment_id, s.session_id, s.segment, s.summary, s.group_id")).result_set
    for segment_id, session_id, segment, summary, group_id in rows:
        if group_id != group:
            truth.misplaced.append(f"session of {group_id}")
            continue
        truth.sessions[segment_id] = (session_id, int(segment or 0), summary or "")
    return truth


@dataclass
class Viewer:
    """Whose memory is asked for, and what the answer may hold."""

    label: str
    scopes: MemoryScopes
    memory_group: str  # the group /memory/* and the stored context layers read
    recall_groups: list[str]  # the graph groups the context's recall layer may read


@dataclass
class World:
    stack: IsolationStack
    plan: Plan
    llm: RecordingRules
    truth: dict[str, MemoryTruth]  # memory group -> its session layer
    memory_names: dict[str, set[str]]  # memory group -> names its notes, preferences, summaries may say
    graph_names: dict[str, set[str]]  # graph group -> names its turns and promotions say
    during: list[tuple[Viewer, str, list[dict[str, Any]]]]  # (viewer, route, items) asked during the closes
    checked: dict[str, int] = field(default_factory=dict)

    @property
    def all_names(self) -> set[str]:
        return set().union(*self.memory_names.values(), *self.graph_names.values())

    def count(self, path: str, n: int) -> None:
        self.checked[path] = self.checked.get(path, 0) + n

    def viewers(self) -> list[Viewer]:
        p, prefix = self.plan, self.plan.prefix
        out = []
        for user in p.users:
            sessions = [c for c in p.convs if c.user == user]
            out.append(Viewer(f"user {user}", MemoryScopes(user=user), p.memory_group(user=user),
                              [subjects.user_group(prefix, user)]))
            for c in sessions:
                out.append(Viewer(f"user {user} in session {c.session_id}", MemoryScopes(user=user, session=c.session_id),
                                  p.memory_group(user=user),
                                  [subjects.session_group(prefix, c.session_id), subjects.user_group(prefix, user)]))
                if c.workspace:
                    out.append(Viewer(f"user {user} in workspace", MemoryScopes(user=user, workspace=c.workspace),
                                      p.memory_group(user=user), [subjects.workspace_group(prefix, c.workspace),
                                                                  subjects.user_group(prefix, user)]))
        for w in p.workspaces:
            out.append(Viewer(f"workspace {w}", MemoryScopes(workspace=w), p.memory_group(workspace=w),
                              [subjects.workspace_group(prefix, w)]))
        for c in p.convs:
            out.append(Viewer(f"session {c.session_id}", MemoryScopes(session=c.session_id),
                              p.memory_group(session=c.session_id), [subjects.session_group(prefix, c.session_id)]))
        return out


def ownership(p: Plan) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(memory group -> names its session layer may say, graph group -> names its turns may say)."""
    memory: dict[str, set[str]] = {}
    graph: dict[str, set[str]] = {}
    for c in p.convs:
        memory.setdefault(p.memory_group(user=c.user, workspace=c.workspace, session=c.session_id), set()).update(c.names)
        for _, g in scope_groups(p.prefix, c.session_id, ScopeKeys(user=c.user, workspace=c.workspace)):
            graph.setdefault(g, set()).update(c.names)
    for w in p.writes:
        memory.setdefault(p.memory_group(**w.scopes.model_dump(include={"user", "workspace", "session"})), set()).update(w.names)
    for workspace, _, name in p.promotions:
        graph.setdefault(subjects.workspace_group(p.prefix, workspace), set()).add(name)
    return memory, graph


def foreign(world: World, allowed: set[str], text: str) -> list[str]:
    low = text.lower()
    return sorted(n for n in world.all_names - allowed if n.lower() in low)


def scope_params(scopes: MemoryScopes) -> dict[str, str]:
    return {k: v for k, v in scopes.model_dump(include={"user", "workspace", "session"}).items() if v}


# --- the checks of one view ------------------------------------------------------------------

def check_notes(world: World, v: Viewer, route: str, notes: list[dict[str, Any]]) -> None:
    truth, allowed = world.truth[v.memory_group], world.memory_names.get(v.memory_group, set())
    for n in notes:
        owner = next((g for g, t in world.truth.items() if n["uuid"] in t.notes), None)
        assert truth.notes.get(n["uuid"]) == n["text"], f"{route} for {v.label}: note {n['uuid']} of {owner}"
        assert not foreign(world, allowed, n["text"]), f"{route} for {v.label}: a note names {foreign(world, allowed, n['text'])}"
    world.count(route, len(notes))


def check_preferences(world: World, v: Viewer, route: str, preferences: list[dict[str, Any]]) -> None:
    truth, allowed = world.truth[v.memory_group], world.memory_names.get(v.memory_group, set())
    for p in preferences:
        item = (p["key"], p["value"], when(p["set_at"]))
        owner = next((g for g, t in world.truth.items() if item in t.preferences), None)
        assert item in truth.preferences, f"{route} for {v.label}: preference {item} of {owner}"
        assert not foreign(world, allowed, f"{p['key']} {p['value']}"), f"{route} for {v.label}: {p['value']!r}"
    world.count(route, len(preferences))


def check_sessions(world: World, v: Viewer, route: str, sessions: list[dict[str, Any]]) -> None:
    truth, allowed = world.truth[v.memory_group], world.memory_names.get(v.memory_group, set())
    for s in sessions:
        owner = next((g for g, t in world.truth.items() if s["segment_id"] in t.sessions), None)
        assert truth.sessions.get(s["segment_id"]) == (s["session_id"], s["segment"], s["summary"]), \
            f"{route} for {v.label}: session segment {s['segment_id']} of {owner}"
        assert not foreign(world, allowed, s["summary"]), f"{route} for {v.label}: a summary names {foreign(world, allowed, s['summary'])}"
    world.count(route, len(sessions))


_SOURCE = re.compile(r'^<(\w+) source="([^"]*)">\n(.*)\n</\1>$', re.S)


def section_lines(text: str) -> tuple[str, list[str]]:
    match = _SOURCE.match(text)
    assert match, text[:200]
    return match.group(2), match.group(3).split("\n")


def check_context(world: World, v: Viewer, route: str, answer: ContextResponse) -> None:
    assert answer.status == "ok", answer.reason
    assert not answer.degraded, answer.reason
    truth, mine = world.truth[v.memory_group], world.memory_names.get(v.memory_group, set())
    for section in answer.sections:
        source, lines = section_lines(section.text)
        items = 0
        if section.layer == "user_context":
            assert source.startswith(f"group {v.memory_group}:"), (v.label, source)
            notes = set(truth.notes.values())
            part = ""
            for line in lines:
                if line in ("Preferences:", "Notes:"):
                    part = line
                    continue
                body = line.removeprefix("- ").removesuffix("…")
                if part == "Preferences:":
                    key, _, value = body.partition(": ")
                    assert any(k == key and val.startswith(value) for k, val in truth.current), \
                        f"{route} user_context for {v.label}: preference {key}={value!r} is not the group's"
                else:
                    assert any(n.startswith(body) for n in notes), f"{route} user_context for {v.label}: note {body!r}"
                items += 1
            allowed = mine
        elif section.layer == "session_summary":
            assert source.startswith(f"group {v.memory_group}: "), (v.label, source)
            match = re.match(rf"group {re.escape(v.memory_group)}: session (\S+) segment (\d+),", source)
            if match:  # one session: the source names it
                record = next((r for r in truth.sessions.values() if r[:2] == (match.group(1), int(match.group(2)))), None)
                assert record is not None, f"{route} session_summary for {v.label}: {source} is not the group's"
                assert record[2].strip().startswith("\n".join(lines).removesuffix("…").strip()), (v.label, section.text[:300])
                allowed, items = mine, 1
            else:  # several chained: each opens with its own heading (services/sessions/context.py)
                heads = [m for m in (re.match(r"\[session (\S+) segment (\d+), closed [^\]]*\] ?(.*)", line)
                                     for line in lines) if m]
                assert heads and "last" in source, (v.label, source, lines[:3])
                for head in heads:
                    record = next((r for r in truth.sessions.values() if r[:2] == (head.group(1), int(head.group(2)))), None)
                    assert record is not None, f"{route} session_summary for {v.label}: {head.group(0)[:80]} is not the group's"
                    assert record[2].strip().startswith(head.group(3).removesuffix("…").strip()), (v.label, head.group(0)[:200])
                allowed, items = mine, len(heads)
        elif section.layer in ("recall", "agent_memory"):
            if section.layer == "agent_memory":
                assert v.scopes.workspace and f"workspace group {subjects.workspace_group(world.plan.prefix, v.scopes.workspace)}:" in source
            allowed = set().union(*(world.graph_names.get(g, set()) for g in v.recall_groups))
            items = sum(1 for line in lines if line.strip())
        else:
            raise AssertionError(f"unexpected layer {section.layer}")
        leaked = foreign(world, allowed, section.text)
        assert not leaked, f"{route} {section.layer} for {v.label} names {leaked}"
        world.count(f"{route} {section.layer}", items)


# --- building the world --------------------------------------------------------------------

async def http_json(stack: IsolationStack, method: str, url: str, **kwargs: Any) -> Any:
    assert stack.http is not None
    r = await stack.http.request(method, url, **kwargs)
    assert r.status_code in (200, 201, 202), (method, url, r.status_code, r.text)
    return r.json()


async def save(stack: IsolationStack, w: Write) -> None:
    """One API write, through the gateway or straight on the request/reply subject."""
    if w.via == "nats":
        if w.kind == "note":
            subject, request = subjects.MEMORY_NOTE_SAVE, SaveUserNoteRequest(scopes=w.scopes, text=w.text)
        else:
            subject, request = subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(scopes=w.scopes, key=w.key, value=w.text)
        reply = MemoryResponse.model_validate_json((await stack.nc.request(subject, request.model_dump_json().encode(),
                                                                           timeout=15)).data)
        assert reply.status == "ok", reply.reason
    elif w.kind == "note":
        await http_json(stack, "POST", "/memory/notes", params=scope_params(w.scopes), json={"text": w.text})
    else:
        await http_json(stack, "PUT", f"/memory/preferences/{w.key}", params=scope_params(w.scopes), json={"value": w.text})


async def ask_views(stack: IsolationStack, v: Viewer, query: str | None = None) -> list[tuple[str, Any]]:
    params = scope_params(v.scopes)
    out: list[tuple[str, Any]] = [
        ("GET /memory/notes", await http_json(stack, "GET", "/memory/notes", params={**params, "limit": 1000})),
        ("GET /memory/preferences", await http_json(stack, "GET", "/memory/preferences", params=params)),
        ("GET /memory/preferences?include_history", await http_json(
            stack, "GET", "/memory/preferences", params={**params, "include_history": "true"})),
        ("GET /memory/sessions", await http_json(stack, "GET", "/memory/sessions", params={**params, "limit": 1000})),
    ]
    if query is not None:
        body = {"scopes": v.scopes.model_dump(exclude_none=True), "query": query, "budgets": BUDGETS, "timeout_ms": 10_000}
        out.append(("POST /context", ContextResponse.model_validate(await http_json(stack, "POST", "/context", json=body))))
        reply = await stack.nc.request(subjects.CONTEXT, json.dumps(body).encode(), timeout=15)
        out.append(("NATS engram.context", ContextResponse.model_validate_json(reply.data)))
        request = ListUserNotesRequest(scopes=v.scopes, limit=1000)
        reply = await stack.nc.request(subjects.MEMORY_NOTES_LIST, request.model_dump_json().encode(), timeout=15)
        answer = MemoryResponse.model_validate_json(reply.data)
        assert answer.status == "ok" and answer.group_id == v.memory_group, (answer.status, answer.group_id, v.label)
        out.append(("NATS engram.memory.notes.list", [n.model_dump(mode="json") for n in answer.notes]))
    return out


def check_view(world: World, v: Viewer, route: str, answer: Any) -> None:
    if isinstance(answer, ContextResponse):
        check_context(world, v, route, answer)
    elif "notes" in route:
        check_notes(world, v, route, answer)
    elif "preferences" in route:
        check_preferences(world, v, route, answer)
    else:
        check_sessions(world, v, route, answer)


async def build_world(stack: IsolationStack, p: Plan, graph_url: str, timeout: float = 150.0) -> tuple[dict[str, MemoryTruth], list, float]:
    """Publish and close every conversation, make every API write and promotion at once, and ask
    random viewers' /memory/* views meanwhile; wait until every segment is closed and every turn
    extracted. The truth per memory group, the answers given meanwhile, the seconds it took."""
    js = stack.nc.jetstream()
    started = time.perf_counter()
    finished = asyncio.Event()
    during: list[tuple[Viewer, str, Any]] = []
    memory_groups = {p.memory_group(user=c.user, workspace=c.workspace, session=c.session_id) for c in p.convs}
    memory_groups |= {p.memory_group(**w.scopes.model_dump(include={"user", "workspace", "session"})) for w in p.writes}
    # every group a viewer may ask for, also those that hold no memory (a user's session group)
    memory_groups |= {p.memory_group(session=c.session_id) for c in p.convs}
    memory_groups |= {p.memory_group(workspace=w) for w in p.workspaces}
    # viewers of the groups' memory, asked while it is written (their answers checked afterwards)
    sample = [Viewer(f"user {u}", MemoryScopes(user=u), p.memory_group(user=u), []) for u in p.users]

    async def ask_meanwhile(seed: int) -> None:
        rng = random.Random(seed)
        while not finished.is_set():
            v = rng.choice(sample)
            for route, answer in await ask_views(stack, v):
                during.append((v, route + " (during the closes)", answer))

    async def promote(workspace: str, text: str) -> None:
        await http_json(stack, "POST", "/promote", json={"kind": "decision", "text": text, "scope": "workspace",
                                                         "key": workspace})

    askers = [asyncio.create_task(ask_meanwhile(seed)) for seed in range(2)]
    try:
        # the first value of each replaced preference is set before the rest (the latest wins)
        firsts = [w for i, w in enumerate(p.writes) if w.kind == "preference" and
                  any(o.key == w.key and o.scopes == w.scopes for o in p.writes[i + 1:])]
        await asyncio.gather(*(save(stack, w) for w in firsts))
        reports, *_ = await asyncio.gather(
            asyncio.gather(*(publish_events(js, c.events()) for c in p.convs)),
            *(save(stack, w) for w in p.writes if w not in firsts),
            *(promote(w, text) for w, text, _ in p.promotions),
        )
        assert sum(r.messages for r in reports) == sum(2 * len(c.turns) for c in p.convs)
        host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
        db = FalkorDB(host=host, port=int(port))
        try:
            while True:
                existing = set(await db.list_graphs())
                # every segment closed, in whichever group (a misplaced one is the tests' to find)
                closed = {}
                for g in memory_groups:
                    if g in existing:
                        rows = (await db.select_graph(g).ro_query(
                            f"MATCH (s:{SESSION}) WHERE s.state = 'closed' RETURN count(s)")).result_set
                        closed[g] = rows[0][0]
                episodes = {}
                for c in p.convs:
                    g = subjects.session_group(p.prefix, c.session_id)
                    if g in existing:
                        episodes[g] = (await db.select_graph(g).ro_query("MATCH (e:Episodic) RETURN count(e)")).result_set[0][0]
                infos = await js.consumers_info(subjects.STREAM_EPISODES)
                idle = all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos if i.name.startswith("extractor"))
                done = (sum(closed.values()) >= len(p.convs)
                        and all(episodes.get(subjects.session_group(p.prefix, c.session_id), 0) >= len(c.turns) for c in p.convs))
                if done and idle:
                    break
                if any(t.done() for t in askers):
                    break  # an asker failed: its error is raised below
                if time.perf_counter() - started > timeout:
                    raise AssertionError(f"not closed after {timeout:.0f} s: {sum(closed.values())} of {len(p.convs)}")
                await asyncio.sleep(0.25)
            elapsed = time.perf_counter() - started
            finished.set()
            await asyncio.gather(*askers)
            return {g: await read_memory(db, g) for g in memory_groups}, during, elapsed
        finally:
            await db.aclose()
    finally:
        finished.set()
        for t in askers:
            t.cancel()


@pytest.fixture(scope="module")
def world(nats_server, falkordb_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: ANN001
    run = uuid.uuid4().hex[:6]
    prefix = f"mem{run}"
    llm = RecordingRules()
    stack = IsolationStack(nats_server.url, falkordb_server.url, tmp_path_factory.mktemp("memory-isolation"), prefix,
                           sessions_llm=llm).start()
    try:
        p = plan(run, prefix)
        truth, during, elapsed = stack.run(build_world(stack, p, falkordb_server.url), timeout=200)
        memory_names, graph_names = ownership(p)
        w = World(stack, p, llm, truth, memory_names, graph_names, during)
        w.checked["closed_in_s"] = round(elapsed, 1)
        yield w
        print(f"\nmemory isolation: {len(p.convs)} conversations closed, {len(p.writes)} notes and preferences saved, "
              f"in {elapsed:.1f} s; items checked per view: {w.checked}")
    finally:
        stack.stop()


# --- the tests -----------------------------------------------------------------------------

def test_every_memory_group_holds_its_own_summaries_preferences_and_notes(world: World) -> None:
    """The ground truth itself: every segment closed into its memory group, the extracted and the
    saved preferences and notes there, and no group's session layer names another's."""
    p = world.plan
    for c in p.convs:
        g = p.memory_group(user=c.user, workspace=c.workspace, session=c.session_id)
        assert c.session_id in {s for s, _, _ in world.truth[g].sessions.values()}, (c.session_id, g)
    for i, user in enumerate(p.users):
        truth = world.truth[p.memory_group(user=user)]
        keys = {k for k, _ in truth.current}
        # extracted by the rules model from the user's own words, and saved through the API
        assert {"favorite_band", "favorite_coffee", "preferred_name", "home_city", "morning_routine"} <= keys, (user, keys)
        assert len(truth.sessions) == 2 and len(truth.notes) >= 3, (user, truth)
        assert len([k for k, _, _ in truth.preferences if k == "morning_routine"]) == 2  # one replaced
    for g, truth in world.truth.items():
        assert not truth.misplaced, f"graph {g} holds {truth.misplaced}"
        leaked = foreign(world, world.memory_names.get(g, set()), " ".join(truth.texts))
        assert not leaked, f"memory group {g} names {leaked}"
        # a group something was written to has notes; the others (a user's session group) nothing
        assert bool(truth.notes) == (g in world.memory_names), f"memory group {g}: {len(truth.notes)} notes"


def test_the_summary_prompts_show_only_the_groups_own_previous_summaries(world: World) -> None:
    """The sessions service's own view: the previous summaries it puts in a summary prompt come
    from the closing segment's memory group only (a real model would copy them into the summary)."""
    by_speaker = {c.speaker: c for c in world.plan.convs}
    with_previous = 0
    for prompt in world.llm.summary_prompts:
        previous = prompt.split("<PREVIOUS_SUMMARIES>", 1)[1].split("</PREVIOUS_SUMMARIES>", 1)[0]
        transcript = json.loads(prompt.split("<TRANSCRIPT>", 1)[1].split("</TRANSCRIPT>", 1)[0])
        speakers = {line["name"] for line in transcript if line.get("name")}
        assert len(speakers) == 1, speakers
        c = by_speaker[speakers.pop()]
        g = world.plan.memory_group(user=c.user, workspace=c.workspace, session=c.session_id)
        leaked = foreign(world, world.memory_names.get(g, set()), previous)
        assert not leaked, f"the summary prompt of {c.session_id} shows {leaked} (not of {g})"
        with_previous += bool(json.loads(previous))
    assert len(world.llm.summary_prompts) >= len(world.plan.convs)
    world.checked["summary prompts with previous summaries"] = with_previous


def test_views_asked_while_the_segments_were_closing_were_the_users_own(world: World) -> None:
    assert len(world.during) >= 8, "too few views asked during the closes to mean anything"
    for v, route, answer in world.during:
        check_view(world, v, route, answer)


def test_deleting_another_groups_note_through_ones_own_scope_finds_nothing(world: World) -> None:
    """A note's uuid is no capability: ``DELETE /memory/notes/{uuid}`` through another user's,
    workspace's or session's scope is a 404, and the note is still its owner's."""
    viewers = world.viewers()

    async def probe(v: Viewer) -> None:
        assert world.stack.http is not None
        others = [(g, u) for g, t in world.truth.items() if g != v.memory_group for u in t.notes]
        g, note = random.Random(v.label).choice(others)
        r = await world.stack.http.delete(f"/memory/notes/{note}", params=scope_params(v.scopes))
        assert r.status_code == 404, (v.label, g, r.status_code, r.text)
        owner = next(x for x in viewers if x.memory_group == g)
        notes = await http_json(world.stack, "GET", "/memory/notes", params={**scope_params(owner.scopes), "limit": 1000})
        assert note in {n["uuid"] for n in notes}, f"{v.label} deleted a note of {g}"

    async def all_probes() -> None:
        await asyncio.gather(*(probe(v) for v in viewers[::3]))

    world.stack.run(all_probes())
    world.count("DELETE /memory/notes of another group (404)", len(viewers[::3]))


@st.composite
def cases(draw: st.DrawFn, world: World, viewers: list[Viewer]) -> tuple[Viewer, str]:
    """(viewer, query): the query's words from every conversation's, weighted towards the shared
    words and the viewer's own."""
    v = draw(st.sampled_from(viewers))
    own = sorted({w for c in world.plan.convs if v.memory_group == world.plan.memory_group(
        user=c.user, workspace=c.workspace, session=c.session_id) for w in c.words}) or SHARED_WORDS
    vocabulary = sorted({w for c in world.plan.convs for w in c.words})
    word = st.one_of(st.sampled_from(SHARED_WORDS), st.sampled_from(own), st.sampled_from(vocabulary))
    return v, " ".join(draw(st.lists(word, min_size=1, max_size=6)))


def test_no_view_of_one_users_memory_returns_an_item_of_another(world: World) -> None:
    """The property: for any viewer (a user, a user in their workspace or session, a workspace, a
    session) and query, /context (and engram.context) and every /memory/* list hold only the
    viewer's memory group's items, and the context's recall and agent_memory sections only the
    groups the scopes name."""
    viewers = world.viewers()
    answered = {"examples": 0, "views": 0, "context sections": 0}

    async def check(v: Viewer, query: str) -> None:
        for route, answer in await ask_views(world.stack, v, query):
            check_view(world, v, route, answer)
            answered["views"] += 1
            if isinstance(answer, ContextResponse):
                answered["context sections"] += len(answer.sections)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.lists(cases(world, viewers), min_size=1, max_size=3))
    def prop(batch: list[tuple[Viewer, str]]) -> None:
        """One example: up to 3 viewers asked at once."""
        answered["examples"] += 1

        async def together() -> None:
            await asyncio.gather(*(check(v, query) for v, query in batch))

        world.stack.run(together(), timeout=60)

    prop()
    # not vacuous: the stored layers were served (a user's context always has notes and a summary)
    assert world.checked.get("POST /context user_context", 0) > 0 and world.checked.get("POST /context session_summary", 0) > 0
    world.checked.update(answered)

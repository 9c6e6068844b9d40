"""Isolation under load (issue 16, item 4): 50 groups ingested at once, and no recall, search or
explorer view of one group ever returns an item of another.

The services run in-process on one event loop in a background thread (tests/support/stack.py:
turn-detector, extractor with the offline rules model and the hashing embedder, recall, the
gateway under uvicorn on a loopback port), against the suite's real NATS JetStream and FalkorDB.
50 conversations are published concurrently (one ``engram.publishing.ingest.publish_events`` per
conversation, gathered): half write to a group the client names (``ScopeKeys(group=...)``, as
the gateway's REST clients do), half to their session's derived group
(``ScopeKeys(session=True)``, recall asked by ``scopes.session``). Every conversation names people, a company and a project no other group
names, and all of them talk about the same things ("Paris", "the deploy", "the pipeline"), so
a search that leaked across groups would find the other groups' turns and facts.

The ground truth is read from the graph itself, one FalkorDB graph per group: the uuids of its
episodes, entities and facts. Two independent checks on every returned item: its uuid is one
of the asked group's (an item of no group, or of another, fails), and its text names no other
group's unique names. The property test (hypothesis) draws batches of up to 4 cases, asked at once:
a group, a second group and a query of words from the union of all groups' vocabularies, for
every path:

* recall over NATS (``engram.recall``, by ``group_ids`` or by ``scopes.session``), incl. its
  rendered prompt section;
* the gateway's ``POST /search`` with ``group_ids=[g]`` and with ``[g, g2]``, ``POST /get-memory``;
* ``GET /episodes/{g}``, the explorer's ``GET /entities/{g}`` and ``GET /facts/{g}``.

Recall and search are also asked for random groups *while* the 50 groups are being ingested,
and a shared session where two users (each naming their own ``scopes.user``) speak before the
reply must leave each user's words in that user's memory only.

``ENGRAM_ISOLATION_EXAMPLES`` sets the number of examples (default 40, CI); the figures of the
last full run are in docs/reliability.md ("Isolation"). The sessions service's ``/context`` and
``/memory/*`` views (user notes, preferences, session summaries; a separate store) are the
subject of tests/services/test_memory_isolation.py, on the same stack.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
from falkordb.asyncio import FalkorDB
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram.publishing.ingest import publish_events
from engram.schemas import ChatMessage, RecallRequest, RecallResponse, ScopeKeys, SessionClosed, subjects
from engram.schemas.messages import RecallScopes
from tests.support.names import SHARED_WORDS, unique_names
from tests.support.stack import IsolationStack

pytestmark = pytest.mark.slow

GROUPS = 50
EXAMPLES = int(os.environ.get("ENGRAM_ISOLATION_EXAMPLES", "40"))
T0 = datetime(2026, 3, 1, 9, tzinfo=timezone.utc)


@dataclass
class Conversation:
    index: int
    session_id: str
    group_id: str
    by_session: bool  # True: the group is the session's derived group; False: named by the client
    names: list[str]  # person, friend, company, project: unique to this group
    turns: list[tuple[str, str]]

    @property
    def words(self) -> list[str]:
        return sorted({w.strip(".,!?") for u, a in self.turns for w in (u + " " + a).split() if len(w) > 2})

    def events(self) -> list[ChatMessage | SessionClosed]:
        scopes = ScopeKeys(session=True) if self.by_session else ScopeKeys(session=True, group=self.group_id)
        out: list[ChatMessage | SessionClosed] = []
        for t, (user, bot) in enumerate(self.turns):
            for k, (role, text) in enumerate((("user", user), ("assistant", bot))):
                out.append(ChatMessage(message_id=f"m{t}-{k}", session_id=self.session_id, role=role, content=text,
                                       timestamp=T0 + timedelta(minutes=t, seconds=k), scopes=scopes,
                                       name=self.names[0] if role == "user" else None))
        out.append(SessionClosed(session_id=self.session_id, closed_at=T0 + timedelta(hours=1)))
        return out


def conversations(run: str, prefix: str) -> list[Conversation]:
    names = unique_names(4 * GROUPS)
    out = []
    for i in range(GROUPS):
        person, friend, company, project = names[4 * i: 4 * i + 4]
        turns = [
            (f"{person} moved to Paris last spring and works at {company} on the deploy pipeline.",
             f"Paris in spring sounds great. How is the deploy pipeline at {company} going?"),
            (f"The deploy of {project} failed twice, so {person} met {friend} in Paris for coffee.",
             f"Tell {friend} that the fix for the {project} release is ready."),
        ]
        if i % 3 == 0:
            turns.append((f"{friend} joined the {company} team in Berlin after the {project} release.",
                          f"Good news for {friend} and the team in Berlin."))
        session = f"iso-{run}-{i:02d}"
        by_session = i % 2 == 1
        group = subjects.session_group(prefix, session) if by_session else f"iso_{run}_{i:02d}"
        out.append(Conversation(i, session, group, by_session, [person, friend, company, project], turns))
    return out


@dataclass
class GroupTruth:
    """What one group's graph holds, read straight from FalkorDB."""

    episodes: set[str] = field(default_factory=set)
    entities: set[str] = field(default_factory=set)
    facts: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)  # episode contents, entity names and summaries, facts

    @property
    def items(self) -> set[str]:
        return self.episodes | self.entities | self.facts


async def read_group(db: FalkorDB, group: str) -> GroupTruth:
    graph = db.select_graph(group)
    truth = GroupTruth()
    for query, into in (
        ("MATCH (e:Episodic) RETURN e.uuid, e.group_id, e.content", truth.episodes),
        ("MATCH (n:Entity) RETURN n.uuid, n.group_id, n.name + ' ' + coalesce(n.summary, '')", truth.entities),
        ("MATCH ()-[r:RELATES_TO]->() RETURN r.uuid, r.group_id, r.fact", truth.facts),
    ):
        for uuid_, group_id, text in (await graph.ro_query(query)).result_set:
            assert group_id == group, f"graph {group} holds an item of group {group_id}"
            into.add(uuid_)
            truth.texts.append(text or "")
    return truth


@dataclass
class Answer:
    path: str
    group_id: str
    items: list[tuple[str, str]]  # (uuid, text)


@dataclass
class World:
    stack: IsolationStack
    convs: list[Conversation]
    truth: dict[str, GroupTruth]
    vocabulary: list[str]
    during_ingest: list[Answer]
    checked: dict[str, int] = field(default_factory=dict)  # path -> items checked

    def count(self, path: str, n: int) -> None:
        self.checked[path] = self.checked.get(path, 0) + n


async def ingest_and_wait(stack: IsolationStack, convs: list[Conversation], graph_url: str,
                          timeout: float = 150.0) -> tuple[dict[str, GroupTruth], float, list[Answer]]:
    """Publish all conversations at once and, while the pipeline writes them, keep asking recall
    and the gateway's search for random groups; wait until every group's episodes are in its graph
    and the extractor is idle. The ground truth per group, the seconds it took, and the answers
    given during ingestion (checked against the truth afterwards)."""
    js = stack.nc.jetstream()
    started = time.perf_counter()
    finished = asyncio.Event()
    answers: list[Answer] = []

    async def ask_meanwhile(seed: int) -> None:
        rng = random.Random(seed)
        while not finished.is_set():
            c = rng.choice(convs)
            query = " ".join(rng.sample(SHARED_WORDS, 2) + [rng.choice(c.names)])
            answer = await recall_request(stack, c, query, 20, True)
            answers.append(Answer("NATS engram.recall (during ingest)", c.group_id,
                                  [(i.uuid, i.fact) for i in answer.items]))
            assert stack.http is not None
            r = await stack.http.post("/search", json={"group_ids": [c.group_id], "query": query, "max_facts": 20})
            assert r.status_code == 200, r.text
            answers.append(Answer("POST /search (during ingest)", c.group_id,
                                  [(f["uuid"], f["fact"]) for f in r.json()["facts"]]))

    askers = [asyncio.create_task(ask_meanwhile(seed)) for seed in range(4)]
    try:
        reports = await asyncio.gather(*(publish_events(js, c.events()) for c in convs))
        assert sum(r.messages for r in reports) == sum(2 * len(c.turns) for c in convs)
        assert not any(r.duplicates for r in reports)
        host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
        db = FalkorDB(host=host, port=int(port))
        try:
            while True:
                existing = set(await db.list_graphs())
                counts = {}
                for c in convs:
                    if c.group_id in existing:
                        rows = (await db.select_graph(c.group_id).ro_query("MATCH (e:Episodic) RETURN count(e)")).result_set
                        counts[c.group_id] = rows[0][0]
                done = all(counts.get(c.group_id, 0) >= len(c.turns) for c in convs)
                infos = await js.consumers_info(subjects.STREAM_EPISODES)
                idle = all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos if i.name.startswith("extractor"))
                if done and idle:
                    break
                if any(t.done() for t in askers):
                    break  # an asker failed: its error is raised below
                if time.perf_counter() - started > timeout:
                    missing = {c.group_id: counts.get(c.group_id, 0) for c in convs if counts.get(c.group_id, 0) < len(c.turns)}
                    raise AssertionError(f"not extracted after {timeout:.0f} s: {missing}")
                await asyncio.sleep(0.25)
            elapsed = time.perf_counter() - started
            finished.set()
            await asyncio.gather(*askers)
            return {c.group_id: await read_group(db, c.group_id) for c in convs}, elapsed, answers
        finally:
            await db.aclose()
    finally:
        finished.set()
        for t in askers:
            t.cancel()


@pytest.fixture(scope="module")
def world(nats_server, falkordb_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: ANN001
    run = uuid.uuid4().hex[:6]
    prefix = f"iso{run}"
    stack = IsolationStack(nats_server.url, falkordb_server.url, tmp_path_factory.mktemp("isolation"), prefix).start()
    try:
        convs = conversations(run, prefix)
        assert len({c.group_id for c in convs}) == GROUPS
        truth, elapsed, answers = stack.run(ingest_and_wait(stack, convs, falkordb_server.url), timeout=200)
        vocabulary = sorted({w for c in convs for w in c.words})
        w = World(stack, convs, truth, vocabulary, answers)
        w.checked["ingest_s"] = round(elapsed, 1)  # type: ignore[assignment]
        yield w
        print(f"\nisolation: {GROUPS} groups, {sum(len(c.turns) for c in convs)} turns, ingested in {elapsed:.1f} s; "
              f"items checked per path: {w.checked}")
    finally:
        stack.stop()


def foreign_names(world: World, allowed: set[str]) -> dict[str, str]:
    """unique name (lower case) -> its group, for every group not in ``allowed``."""
    return {n.lower(): c.group_id for c in world.convs if c.group_id not in allowed for n in c.names}


def assert_only(world: World, path: str, allowed: set[str], items: list[tuple[str, str]]) -> None:
    """Every (uuid, text) belongs to a group in ``allowed``: by uuid against the graph, and by text."""
    own = set().union(*(world.truth[g].items for g in allowed))
    foreign = foreign_names(world, allowed)
    for uuid_, text in items:
        owner = next((g for g, t in world.truth.items() if uuid_ in t.items), None)
        assert uuid_ in own, f"{path}: item {uuid_} of group {owner} returned for groups {sorted(allowed)}"
        leaked = [n for n in foreign if n in text.lower()]
        assert not leaked, f"{path}: {sorted(allowed)} returned text naming {leaked} of {foreign[leaked[0]]}"
    world.count(path, len(items))


def test_every_group_was_extracted_into_its_own_graph(world: World) -> None:
    """The ground truth itself: each group's graph holds its own turns, entities and facts, and no
    other group's names (checked on every episode, entity and fact of all 50 graphs)."""
    for c in world.convs:
        truth = world.truth[c.group_id]
        assert len(truth.episodes) == len(c.turns), (c.group_id, len(truth.episodes))
        assert truth.entities and truth.facts, c.group_id
        text = " ".join(truth.texts).lower()
        assert c.names[0].lower() in text
        foreign = foreign_names(world, {c.group_id})
        leaked = [n for n in foreign if n in text]
        assert not leaked, f"graph {c.group_id} names {leaked} of {foreign[leaked[0]]}"
    # every group's items are its own: no uuid is in two groups
    seen: dict[str, str] = {}
    for g, t in world.truth.items():
        for u in t.items:
            assert seen.setdefault(u, g) == g, f"{u} in {g} and {seen[u]}"


def test_the_views_without_a_query_show_only_their_group(world: World) -> None:
    """Every group's episodes, entities and facts through the gateway and the explorer."""
    http = world.stack.http
    assert http is not None

    async def views(c: Conversation) -> None:
        g = c.group_id
        r = await http.get(f"/episodes/{g}", params={"last_n": 1000})
        assert r.status_code == 200, r.text
        assert {e["uuid"] for e in r.json()} == world.truth[g].episodes
        assert all(e["group_id"] == g for e in r.json())
        assert_only(world, "GET /episodes", {g}, [(e["uuid"], e["content"]) for e in r.json()])
        r = await http.get(f"/entities/{g}", params={"limit": 1000})
        assert r.status_code == 200, r.text
        assert r.json() and all(e.get("group_id", g) == g for e in r.json())
        assert_only(world, "GET /entities", {g}, [(e["uuid"], f"{e['name']} {e.get('summary') or ''}") for e in r.json()])
        r = await http.get(f"/facts/{g}", params={"last_n": 1000})
        assert r.status_code == 200, r.text
        assert r.json() and all(f["group_id"] == g for f in r.json())
        assert_only(world, "GET /facts", {g}, [(f["uuid"], f["fact"]) for f in r.json()])

    async def all_views() -> None:
        await asyncio.gather(*(views(c) for c in world.convs))

    world.stack.run(all_views())


async def recall_request(stack: IsolationStack, c: Conversation, query: str, max_facts: int,
                         include_episodes: bool) -> RecallResponse:
    """recall over NATS as an agent asks it: by the session's scope, or by the group's id."""
    scope = {"scopes": RecallScopes(session=c.session_id)} if c.by_session else {"group_ids": [c.group_id]}
    request = RecallRequest(query=query, max_facts=max_facts, include_episodes=include_episodes, timeout_ms=10_000,
                            token_budget=4000, **scope)
    reply = await stack.nc.request(subjects.RECALL, request.model_dump_json().encode(), timeout=15)
    answer = RecallResponse.model_validate_json(reply.data)
    assert not answer.degraded, answer.reason
    assert all(i.group_id == c.group_id for i in answer.items), [i.group_id for i in answer.items]
    return answer


def test_answers_given_while_50_groups_were_being_ingested_were_their_own(world: World) -> None:
    """recall and search asked for random groups while the pipeline wrote all 50 at once."""
    assert len(world.during_ingest) >= 8, "too few queries ran during ingestion to mean anything"
    for answer in world.during_ingest:
        assert_only(world, answer.path, {answer.group_id}, answer.items)


@st.composite
def cases(draw: st.DrawFn, world: World) -> tuple[int, int, str, int, bool]:
    """(group, another group, query, max_facts, include_episodes). The query's words come from
    every group's vocabulary, weighted towards the words all groups share and the group's own
    (else most queries would be other groups' names only and find nothing at all)."""
    g = draw(st.integers(0, GROUPS - 1))
    g2 = draw(st.integers(0, GROUPS - 1).filter(lambda x: x != g))
    word = st.one_of(st.sampled_from(SHARED_WORDS), st.sampled_from(world.convs[g].words),
                     st.sampled_from(world.vocabulary))
    query = " ".join(draw(st.lists(word, min_size=1, max_size=6)))
    return g, g2, query, draw(st.integers(1, 50)), draw(st.booleans())


def test_no_query_of_one_group_returns_an_item_of_another(world: World) -> None:
    """The property: for any group g, other group g2 and query drawn from every group's words,
    recall, search and get-memory return only g's items (only g's and g2's for a search of both)."""
    http = world.stack.http
    assert http is not None
    answered = {"examples": 0, "queries": 0, "recall": 0}

    async def check(c: Conversation, other: Conversation, query: str, max_facts: int, episodes: bool) -> None:
        g = c.group_id
        answer = await recall_request(world.stack, c, query, max_facts, episodes)
        assert_only(world, "NATS engram.recall", {g}, [(i.uuid, i.fact) for i in answer.items])
        leaked = [n for n in foreign_names(world, {g}) if n in answer.prompt_section.lower()]
        assert not leaked, f"recall's prompt section for {g} names {leaked}"
        answered["recall"] += bool(answer.items)
        r = await http.post("/search", json={"group_ids": [g], "query": query, "max_facts": max_facts})
        assert r.status_code == 200, r.text
        assert_only(world, "POST /search [g]", {g}, [(f["uuid"], f["fact"]) for f in r.json()["facts"]])
        r = await http.post("/search", json={"group_ids": [g, other.group_id], "query": query, "max_facts": max_facts})
        assert r.status_code == 200, r.text
        assert_only(world, "POST /search [g, g2]", {g, other.group_id}, [(f["uuid"], f["fact"]) for f in r.json()["facts"]])
        r = await http.post("/get-memory", json={"group_id": g, "max_facts": max_facts, "messages": [
            {"role_type": "user", "role": "someone", "content": query}]})
        assert r.status_code == 200, r.text
        assert_only(world, "POST /get-memory", {g}, [(f["uuid"], f["fact"]) for f in r.json()["facts"]])

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.lists(cases(world), min_size=1, max_size=4))
    def prop(batch: list[tuple[int, int, str, int, bool]]) -> None:
        """One example: up to 4 cases asked at once (recall and the gateway serve them concurrently)."""
        answered["examples"] += 1
        answered["queries"] += len(batch)

        async def together() -> None:
            await asyncio.gather(*(check(world.convs[g], world.convs[g2], query, max_facts, episodes)
                                   for g, g2, query, max_facts, episodes in batch))

        world.stack.run(together(), timeout=60)

    prop()
    # the property is not vacuous: many queries found something (a query of other groups' names
    # only finds nothing, as it should; about a quarter of the words are drawn from those)
    assert answered["recall"] >= answered["queries"] // 3, answered
    world.checked.update(answered)


def test_two_users_speaking_before_the_reply_keep_their_own_memory(world: World) -> None:
    """A shared session (a group chat) where each message names its user scope, and two users speak
    before the assistant answers: each user's memory holds only what that user's turn said. The
    turn-detector used to pair both messages into one turn and merge its scopes, the later user's
    winning, so the first user's words went to the second user's memory (and none to their own)."""
    prefix = world.stack.settings.group_prefix
    run = prefix.removeprefix("iso")
    alice_name, bob_name = unique_names(4 * GROUPS + 2)[-2:]
    alice, bob = f"alice-{run}@example.com", f"bob-{run}@example.com"
    session = f"iso-{run}-shared"
    events: list[ChatMessage | SessionClosed] = [
        ChatMessage(message_id="a1", session_id=session, role="user", name="alice", timestamp=T0,
                    content=f"{alice_name} moved to Paris and the deploy failed.", scopes=ScopeKeys(user=alice)),
        ChatMessage(message_id="b1", session_id=session, role="user", name="bob", timestamp=T0 + timedelta(seconds=5),
                    content=f"{bob_name} fixed the pipeline in Berlin.", scopes=ScopeKeys(user=bob)),
        ChatMessage(message_id="r1", session_id=session, role="assistant", timestamp=T0 + timedelta(seconds=9),
                    content="Thanks both, the release can go out.", scopes=ScopeKeys(user=bob)),
        SessionClosed(session_id=session, closed_at=T0 + timedelta(hours=1)),
    ]
    groups = {subjects.user_group(prefix, alice): (alice_name, bob_name), subjects.user_group(prefix, bob): (bob_name, alice_name)}

    async def ingest_and_read() -> dict[str, str]:
        await publish_events(world.stack.nc.jetstream(), events)
        host, port = world.stack.settings.graph_url.split("://", 1)[1].rsplit(":", 1)
        db = FalkorDB(host=host, port=int(port))
        try:
            js = world.stack.nc.jetstream()
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline:
                existing = set(await db.list_graphs())
                infos = await js.consumers_info(subjects.STREAM_EPISODES)
                idle = all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos if i.name.startswith("extractor"))
                if idle and subjects.session_group(prefix, session) in existing and all(g in existing for g in groups):
                    break
                await asyncio.sleep(0.25)
            out = {}
            for g in groups:
                if g in set(await db.list_graphs()):
                    out[g] = " ".join((await read_group(db, g)).texts).lower()
            return out
        finally:
            await db.aclose()

    texts = world.stack.run(ingest_and_read(), timeout=90)
    for g, (own, other) in groups.items():
        assert g in texts, f"user group {g} ({own}) got no memory at all"
        assert other.lower() not in texts[g], f"{own}'s memory {g} holds {other}'s words"
        assert own.lower() in texts[g]

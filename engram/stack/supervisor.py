"""`engram up`: embedded servers + one process per service, supervised until a signal.

Start order: NATS and FalkorDB (unless external URLs are configured) -> topology -> services
(`engram serve NAME`, each its own process with its own /metrics port) -> runtime file. A service
that dies is restarted with backoff. SIGINT/SIGTERM stops services first (they drain their
in-flight message), then the servers, and removes the runtime file: no process is left behind.
The data dir is locked first (engram/stack/datadir_lock.py): a second `engram up` on it refuses,
naming the running supervisor's pid, and touches nothing of the first stack.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nats

from engram.runtime import auth
from engram.stack import last_stack
from engram.stack.datadir_lock import DataDirLock
from engram.stack.embedded import EmbeddedServerError, ManagedProcess, free_port, http_ok, port_is_free, spawn, start_falkordb, start_nats
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology

log = logging.getLogger("engram.up")

SERVICES: tuple[str, ...] = ("turn-detector", "extractor", "summary-gate", "recall", "gateway", "sessions", "mcp")
"""Services `engram up` runs, in start order. Each later step adds its service here (at the end:
ENGRAM_HTTP_PORT numbers them in this order, so the earlier services keep their ports)."""


STABLE_RUN_S = 10.0
"""A service that ran this long before it died is restarted at once; one that dies sooner (a crash
loop: bad config, a dependency down at start) waits 2, 4, ... 30 s between restarts."""


def restart_delay(ran_for_s: float, quick_failures: int) -> tuple[float, int]:
    """(seconds to wait before the restart, the new count of quick failures in a row)."""
    if ran_for_s >= STABLE_RUN_S:
        return 0.0, 0
    return min(30.0, 2.0 ** (quick_failures + 1)), quick_failures + 1


@dataclass
class ServiceProcess:
    name: str
    port: int
    proc: ManagedProcess | None = None
    restarts: int = 0
    next_restart: float = 0.0
    started_at: float = 0.0
    quick_failures: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Supervisor:
    def __init__(self, settings: EngramSettings, services: tuple[str, ...] = SERVICES) -> None:
        self.settings = settings
        self.data_dir = settings.data_dir
        self.service_names = services
        self.nats: ManagedProcess | None = None
        self.falkordb: ManagedProcess | None = None
        self.services: list[ServiceProcess] = []
        self.nats_url = settings.nats_url
        self.graph_url = settings.graph_url
        # Set when the embedded servers run with passwords (ENGRAM_EMBEDDED_AUTH, engram/runtime/auth.py).
        self.nats_passwords: dict[str, str] | None = None
        self.graph_password: str | None = None
        self._stopping = asyncio.Event()

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        embedded_auth = self.settings.embedded_auth
        if not self.nats_url:
            config = None
            if embedded_auth:  # one user per service, each allowed only its own subjects
                self.nats_passwords = auth.embedded_passwords(self.data_dir)
                config = auth.write_embedded_conf(self.data_dir, self.settings)
            self.nats = self._start_server("nats", self.settings.nats_port, lambda port: start_nats(
                self.data_dir, port=port, config=config, sync_interval=self.settings.nats_sync_interval))
            self.nats_url = self.nats.url
        if not self.graph_url and self.settings.graph_backend == "falkordb":
            if embedded_auth:
                self.graph_password = auth.embedded_passwords(self.data_dir)["falkordb"]
            self.falkordb = self._start_server("falkordb", self.settings.graph_port, lambda port: start_falkordb(
                self.data_dir, port=port, password=self.graph_password, appendfsync=self.settings.graph_appendfsync))
            self.graph_url = self.falkordb.url
        options = self.settings.nats_options()
        if self.nats_passwords:
            options = {"user": auth.ADMIN_USER, "password": self.nats_passwords["admin"]}
        nc = await nats.connect(self.nats_url, name="engram-up", **options)
        try:
            # as admin: the services' users may not create streams (ENGRAM_NATS_TOPOLOGY_ON_START=false)
            topology = dataclasses.replace(Topology.from_settings(self.settings), manage=True)
            await ensure_topology(nc.jetstream(), topology, migrate=True)
        finally:
            await nc.close()
        for i, name in enumerate(self.service_names):
            # ENGRAM_HTTP_PORT is the first service's port; the next ones follow it.
            svc = ServiceProcess(name, self._port(name, self.settings.http_port + i if self.settings.http_port else None)
                                 or free_port())
            self.services.append(svc)
            self._spawn(svc)
        await asyncio.gather(*(self._healthy_or_new_port(s, remembered=not self.settings.http_port)
                               for s in self.services))
        self._write_runtime()
        self._remember_ports()

    async def _healthy_or_new_port(self, svc: ServiceProcess, *, remembered: bool) -> None:
        """Wait for ``svc``; one that died at start on a remembered port (taken between the check and
        its bind) is started once more on a new one. A configured port is never changed."""
        try:
            await self._wait_healthy(svc)
        except RuntimeError:
            if not remembered or (svc.proc is not None and svc.proc.alive()):
                raise
            log.warning("%s did not start on its remembered port %d; trying a new one", svc.name, svc.port)
            svc.port = free_port()
            self._spawn(svc)
            await self._wait_healthy(svc)

    # --- ports: the same across restarts of one data dir, unless taken ------------------------
    @property
    def _ports_file(self) -> Path:
        return self.data_dir / "ports.json"

    def _start_server(self, name: str, configured: int | None,
                      start: Callable[[int | None], ManagedProcess]) -> ManagedProcess:
        """``start(port)`` on the configured port, else the remembered one; a remembered port taken
        between the check and the bind gets a new one (``start(None)``: random)."""
        port = self._port(name, configured)
        try:
            return start(port)
        except EmbeddedServerError:
            if not port or configured:
                raise
            return start(None)

    def _port(self, name: str, configured: int | None) -> int | None:
        """The configured port, else the one this data dir used last time if it is free (so an
        MCP host's config and an explorer bookmark keep working), else None: a new one."""
        if configured:
            return configured
        try:
            last = int(json.loads(self._ports_file.read_text()).get(name) or 0)
        except (OSError, ValueError, TypeError, AttributeError):
            return None
        return last if last and port_is_free(last) else None

    def _remember_ports(self) -> None:
        ports = {svc.name: svc.port for svc in self.services}
        for name, url in (("nats", self.nats_url if self.nats else None),
                          ("falkordb", self.graph_url if self.falkordb else None)):
            if url:
                ports[name] = int(url.rsplit(":", 1)[1].split("/")[0])
        tmp = self._ports_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(ports, indent=1))
        tmp.replace(self._ports_file)

    def _env(self, svc: ServiceProcess) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            ENGRAM_NATS_URL=self.nats_url or "",
            ENGRAM_DATA_DIR=str(self.data_dir),
            ENGRAM_HTTP_HOST="127.0.0.1",
            ENGRAM_HTTP_PORT=str(svc.port),
            GRAPHITI_TELEMETRY_ENABLED="false",
        )
        if self.graph_url:
            env["ENGRAM_GRAPH_URL"] = self.graph_url
        if self.graph_password and self.falkordb:
            env["ENGRAM_GRAPH_URL"] = self.graph_url.replace("://", f"://:{self.graph_password}@", 1)
        if self.nats_passwords:
            # the service's own user: it publishes and subscribes only what engram/runtime/auth.py allows
            env.pop("ENGRAM_NATS_CREDS", None)
            env.update(ENGRAM_NATS_USER=auth.user_name(svc.name), ENGRAM_NATS_PASSWORD=self.nats_passwords[svc.name],
                       ENGRAM_NATS_INBOX_PREFIX=auth.inbox_prefix(svc.name), ENGRAM_NATS_TOPOLOGY_ON_START="false")
        return env

    def _spawn(self, svc: ServiceProcess) -> None:
        # -P: `-m` would put the working directory first on sys.path, and an engram/ folder there (a
        # checkout) would shadow the installed engram (a namespace package: the two would merge)
        argv = [sys.executable, "-P", "-m", "engram.cli", "serve", svc.name]
        log_path = self.data_dir / "logs" / f"{svc.name}.log"
        popen = spawn(svc.name, argv, log_path, env=self._env(svc))
        svc.proc = ManagedProcess(svc.name, popen, svc.url, log_path)
        svc.started_at = time.monotonic()

    async def _wait_healthy(self, svc: ServiceProcess, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert svc.proc is not None
            if not svc.proc.alive():
                raise RuntimeError(f"{svc.name} exited during start-up; see {svc.proc.log_path}")
            if await asyncio.to_thread(http_ok, f"{svc.url}/healthz"):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{svc.name} not healthy after {timeout:.0f}s; see {svc.proc.log_path if svc.proc else ''}")

    async def supervise(self) -> None:
        """Restart dead services (exponential backoff) until stop() is requested."""
        while not self._stopping.is_set():
            now = time.monotonic()
            for svc in self.services:
                if svc.proc is not None and not svc.proc.alive():
                    if svc.next_restart <= svc.started_at:  # just noticed: plan the restart
                        delay, svc.quick_failures = restart_delay(now - svc.started_at, svc.quick_failures)
                        svc.next_restart = now + delay
                    if now < svc.next_restart:
                        continue
                    svc.restarts += 1
                    log.warning("%s exited with %s; restart #%d", svc.name, svc.proc.popen.returncode, svc.restarts)
                    self._spawn(svc)
                    self._write_runtime()
            if self.nats and not self.nats.alive():
                log.error("embedded nats-server died; stopping engram")
                break
            if self.falkordb and not self.falkordb.alive():
                log.error("embedded FalkorDB died; stopping engram")
                break
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    def request_stop(self) -> None:
        self._stopping.set()

    def stop(self) -> None:
        """Services first (they finish their in-flight message), then the servers."""
        for svc in reversed(self.services):
            if svc.proc is not None:
                svc.proc.stop(timeout=20)
        if self.falkordb:
            self.falkordb.stop()
        if self.nats:
            self.nats.stop()
        try:
            self.settings.runtime_file.unlink()
        except FileNotFoundError:
            pass

    # --- runtime file ----------------------------------------------------------------------
    def runtime(self) -> dict:
        return {
            "supervisor_pid": os.getpid(),
            "nats_url": self.nats_url,
            "nats_monitoring_url": self.nats.extra.get("monitoring_url") if self.nats else None,
            "graph_url": self.graph_url,
            # passwords stay in the 0600 file; clients of this stack read them there (settings.py)
            "auth_file": str(auth.passwords_file(self.data_dir)) if self.nats_passwords or self.graph_password else None,
            "nats_auth": bool(self.nats_passwords),
            "graph_auth": bool(self.graph_password),
            "embedded": {
                "nats": self.nats.pid if self.nats else None,
                "falkordb": self.falkordb.pid if self.falkordb else None,
            },
            "services": {
                s.name: {"url": s.url, "pid": s.proc.pid if s.proc else None, "restarts": s.restarts}
                for s in self.services
            },
            "data_dir": str(self.data_dir),
            "started_at": time.time(),
        }

    def _write_runtime(self) -> None:
        tmp = self.settings.runtime_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.runtime(), indent=2))
        tmp.replace(self.settings.runtime_file)


async def run_up(settings: EngramSettings, on_ready=None) -> int:  # noqa: ANN001
    # Before anything else: a second `up` on a running stack's data dir must touch nothing of it
    # (not its servers' files, not its runtime file); DataDirLocked names the running supervisor.
    lock = DataDirLock(settings.data_dir)
    lock.acquire()
    try:
        sup = Supervisor(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, sup.request_stop)
        try:
            await sup.start()
            last_stack.remember(settings.data_dir)  # other commands find it without --data-dir
            if on_ready:
                on_ready(sup)
            await sup.supervise()
        finally:
            last_stack.forget(settings.data_dir)
            await asyncio.to_thread(sup.stop)
    finally:
        lock.release()
    return 0

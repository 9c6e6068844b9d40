"""NATS connection options for short-lived clients (the `engram` command, `engram status`,
`engram doctor`): when no server answers they give up in seconds, quietly, and the caller says
what is wrong. Services use engram/runtime/service.py's options instead: they wait for NATS forever."""

from __future__ import annotations

from typing import Any


async def _quiet(_exc: Exception) -> None:
    """nats-py's default error callback logs every failed attempt with a traceback."""


def quick_connect_options() -> dict[str, Any]:
    """nats.connect keywords: two attempts, ~2.5 s in all, when no server answers.

    nats-py's first connect honours max_reconnect_attempts, where 0 means *unlimited* (a stack
    killed before it removed its runtime file made `engram status` hang), and its default, 60
    attempts 2 s apart, retries for two minutes.
    """
    return {"connect_timeout": 2, "max_reconnect_attempts": 1, "reconnect_time_wait": 0.5, "error_cb": _quiet}


def server_version(nc: Any) -> str:
    """The version of the NATS server ``nc`` is connected to ("2.11.4", "2.12.0-dev"), from
    nats-py's public ``Client.connected_server_version`` ("0.0.0-unknown" before the INFO)."""
    version = nc.connected_server_version
    core = f"{version.major}.{version.minor}.{version.patch}"
    dev = version.dev  # "<prerelease>[+<build>]", or "+<build>" when only a build is given
    return f"{core}{dev}" if dev.startswith("+") or not dev else f"{core}-{dev}"

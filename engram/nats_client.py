"""NATS connection options for short-lived clients (the `engram` command, `engram status`,
`engram doctor`): when no server answers they give up in seconds, quietly, and the caller says
what is wrong. Services use engram/service.py's options instead: they wait for NATS forever."""

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

"""Every engram service in-process on one event loop in a background thread, against real NATS
JetStream and FalkorDB (the rules model as LLM), for the hostile-input tests
(tests/support/stack.py), and a capture of every log line they write.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from tests.support.stack import ServiceStack


class LogCapture(logging.Handler):
    """Every log record of every thread, formatted as the services' own handler would (message,
    arguments and traceback): what an operator's log would hold."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is still a record
            text = f"{record.levelname} {record.name} {record.msg!r} {record.args!r}"
        with self._lock:
            self.lines.append(text)

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def since(self, mark: int) -> str:
        with self._lock:
            return "\n".join(self.lines[mark:])


class Stack(ServiceStack):
    """Every service (the summary-gate and the sessions service too, on the rules model); the
    gateway when asked (schemathesis's target)."""

    def __init__(self, nats_url: str, graph_url: str, data_dir: Path, *, gateway: bool = False) -> None:
        super().__init__(
            EngramSettings(
                nats_url=nats_url, graph_url=graph_url, data_dir=data_dir, partitions=2,
                # two deliveries before a failing message is dead-lettered (0.5 s / 1 s backoff), a
                # 1 s idle timeout so a session's last turn is flushed without a close
                turn=TurnDetectorSettings(max_deliveries=2, idle_timeout_s=1),
            ),
            gateway=gateway, summary_gate_llm=RulesExtractorClient(), sessions_llm=RulesExtractorClient())

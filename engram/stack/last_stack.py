"""Finding the stack a user started: ``engram up --data-dir D`` once, then every other command
without repeating ``--data-dir D`` (issue 27, item 3).

The lookup, in order (engram/cli/commands.py ``_settings``):

1. ``--data-dir`` given: that data dir;
2. ``ENGRAM_DATA_DIR`` or ``ENGRAM_NATS_URL`` set: the settings as they are;
3. a stack running on the default data dir (``$XDG_DATA_HOME/engram``): that one;
4. the data dir of the last ``engram up`` started on this machine by this user, while it runs:
   ``engram up`` writes it to ``$XDG_STATE_HOME/engram/last-up`` (``~/.local/state/engram``) once
   ready and removes it when it stops; a stale one (its supervisor gone, the data dir's lock free)
   is ignored;
5. else the default data dir (and the command says no stack runs there).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engram.stack.embedded import pid_alive


def pointer_file() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "engram" / "last-up"


def remember(data_dir: Path) -> None:
    """Called by `engram up` once its stack is ready."""
    path = pointer_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"data_dir": str(data_dir), "pid": os.getpid()}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: the lookup is a convenience, never a reason to fail


def forget(data_dir: Path) -> None:
    """Called by `engram up` when it stops: only if the pointer still names its data dir."""
    path = pointer_file()
    try:
        if json.loads(path.read_text()).get("data_dir") == str(data_dir):
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def running_data_dir() -> Path | None:
    """The data dir of the last `engram up` while its supervisor runs, else None."""
    try:
        known = json.loads(pointer_file().read_text())
        data_dir, pid = Path(known["data_dir"]), int(known["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pid_alive(pid) or not (data_dir / "engram-runtime.json").exists():
        return None
    # the data dir's lock is held while its `engram up` lives (and freed by the kernel when it is
    # killed): a pid reused by another process after a SIGKILL does not pass
    from engram.stack.datadir_lock import lock_holder

    if lock_holder(data_dir) is None:
        return None
    return data_dir

"""The CLI never destroys or orphans (issue 10, item 3): `engram demo` only deletes directories
it created itself, and a second `engram up` on a running stack's data dir refuses and leaves the
first stack (its processes and its runtime file) alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engram.stack.datadir_lock import DataDirLock, DataDirLocked, lock_holder
from engram.cli.demo import DEMO_MARKER, DemoDirRefused, prepare_demo_dir
from engram.stack.embedded import pid_alive
from tests.engram.cli.test_cli_up import ENGRAM, Up, _env, run


def test_demo_refuses_a_non_empty_directory_it_did_not_create(tmp_path: Path) -> None:
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    out = subprocess.run([*ENGRAM, "demo", "--data-dir", str(mine)], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "not created by `engram demo`" in " ".join(out.stdout.split())
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "precious"


def test_demo_help_names_its_own_default_not_the_real_stacks() -> None:
    out = subprocess.run([*ENGRAM, "demo", "--help"], capture_output=True, text=True, env=_env(), timeout=60,
                         check=True)
    text = " ".join(out.stdout.replace("│", " ").split())
    assert ".local/share/engram" not in text
    assert "./.engram/demo" in text


def test_demo_dir_rules(tmp_path: Path) -> None:
    new = tmp_path / "new" / "demo"
    prepare_demo_dir(new)  # missing: created and marked
    assert [p.name for p in new.iterdir()] == [DEMO_MARKER]

    (new / "up.log").write_text("old run")
    prepare_demo_dir(new)  # marked by the demo: emptied again
    assert [p.name for p in new.iterdir()] == [DEMO_MARKER]

    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_demo_dir(empty)  # empty: the demo may take it
    assert (empty / DEMO_MARKER).is_file()

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(DemoDirRefused):
        prepare_demo_dir(a_file)
    assert a_file.read_text() == "x"


def test_demo_does_not_wipe_its_own_directory_while_a_stack_runs_in_it(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    prepare_demo_dir(demo_dir)
    (demo_dir / "engram-runtime.json").write_text("{}")
    with DataDirLock(demo_dir):
        assert lock_holder(demo_dir) == os.getpid()
        with pytest.raises(DemoDirRefused, match="in use"):
            prepare_demo_dir(demo_dir)
        assert (demo_dir / "engram-runtime.json").exists()
    assert lock_holder(demo_dir) is None
    prepare_demo_dir(demo_dir)
    assert not (demo_dir / "engram-runtime.json").exists()


def test_lock_is_exclusive_and_names_the_holder(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(DataDirLocked) as refused:
            DataDirLock(tmp_path).acquire()
        assert refused.value.pid == os.getpid()
    finally:
        first.release()
    with DataDirLock(tmp_path):  # released: can be taken again
        pass


def test_lock_dies_with_its_holder(tmp_path: Path) -> None:
    """A SIGKILLed `engram up` leaves no stale lock: the kernel drops a flock with its process."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from engram.stack.datadir_lock import DataDirLock;"
         f"DataDirLock(Path({str(tmp_path)!r})).acquire(); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert lock_holder(tmp_path) == holder.pid
    finally:
        holder.kill()
        holder.wait(10)
    assert lock_holder(tmp_path) is None
    with DataDirLock(tmp_path):
        pass


@pytest.mark.slow
def test_second_up_on_a_running_data_dir_refuses_and_orphans_nothing(tmp_path: Path) -> None:
    data = tmp_path / "engram"
    up = Up(data)
    try:
        runtime_before = up.runtime_file.read_text()
        pid = up.runtime["supervisor_pid"]
        second = run("up", data_dir=data, check=False, timeout=60)
        assert second.returncode != 0
        said = " ".join((second.stdout + second.stderr).split())
        assert f"pid {pid}" in said, said
        # the first stack is untouched: its runtime file, its processes, and `engram status` sees it
        assert up.runtime_file.read_text() == runtime_before
        assert all(pid_alive(p) for p in up.pids())
        status = json.loads(run("status", "--json", data_dir=data).stdout)
        assert status["ok"]
    finally:
        code = up.stop()
    assert code == 0
    assert not up.runtime_file.exists()

"""What every `engram` command shares: a failure is one line that says what is wrong and what to
do (the traceback only with ``--debug``), NATS connections that give up within seconds when no
server answers, and output that is neither cut nor wrapped when it goes to a file or a pipe.

User-facing text is printed as :class:`rich.text.Text`, never as console markup: an error that
quotes ``'^[a-zA-Z0-9_-]{1,128}$'`` must reach the user with its brackets.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup, TyperOption

from engram.runtime.nats_client import quick_connect_options
from engram.settings import EngramSettings, default_data_dir

DEBUG_KEY = "engram.debug"


class CliError(Exception):
    """A failure the user can act on: printed as one line, the command exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def error_line(console: Console, message: str) -> None:
    """One line on ``console``: never wrapped at the terminal width, never read as markup."""
    one_line = " ".join(message.splitlines())
    console.print(Text.assemble(("error: ", "bold red"), one_line), soft_wrap=True, highlight=False)


def plain(console: Console, message: str, style: str | None = None) -> None:
    """A line of user-facing text, printed as it is (no markup, no wrapping)."""
    console.print(Text(message, style=style or ""), soft_wrap=True, highlight=False)


def print_table(console: Console, table: Table) -> None:
    """A table at its natural width when the output is not a terminal (a file or pipe has no
    width: rich would cut every column to fit 80), else as wide as the terminal allows."""
    if console.is_terminal:
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update_width(100_000)).maximum
    width = console.width  # print(width=...) cannot exceed the console's own width: widen it for this table
    console.width = max(natural, 20)
    try:
        console.print(table, crop=False)
    finally:
        console.width = width


def print_json(console: Console, data: Any) -> None:
    """JSON for scripts: one document on stdout, no colour codes, no line wrapping."""
    if console.is_terminal:
        console.print_json(json.dumps(data))
    else:
        console.file.write(json.dumps(data, indent=2) + "\n")


# --- where the stack is, and what to do when it is not there ---------------------------------

def _data_dir_flag(settings: EngramSettings) -> str:
    return "" if settings.data_dir == default_data_dir() else f" --data-dir {settings.data_dir}"


def start_hint(settings: EngramSettings) -> str:
    return f"start it with `engram up{_data_dir_flag(settings)}`, or set ENGRAM_NATS_URL to a running NATS"


def unreachable(settings: EngramSettings, url: str, why: str) -> str:
    """What to say when NATS at ``url`` does not answer (and whether its `engram up` is gone)."""
    stale = _stale_runtime(settings)
    if stale:
        return (f"engram in {settings.data_dir} is not running (its `engram up`, pid {stale}, is gone and NATS at "
                f"{url} does not answer): {start_hint(settings)}")
    return f"cannot reach NATS at {url} ({why}): is engram running? {start_hint(settings)}"


def nats_url_or_fail(settings: EngramSettings) -> str:
    """The NATS URL of the stack ``settings`` point at, or a :class:`CliError` saying why there is none."""
    try:
        return settings.resolved_nats_url()
    except RuntimeError as exc:
        if not settings.data_dir.exists():
            raise CliError(f"no engram data directory at {settings.data_dir}: point --data-dir at a running engram's "
                           f"directory, or start one with `engram up{_data_dir_flag(settings)}`") from exc
        if not settings.data_dir.is_dir():
            raise CliError(f"--data-dir {settings.data_dir} is a file, not a directory", code=2) from exc
        raise CliError(f"engram is not running in {settings.data_dir} (no {settings.runtime_file.name}): "
                       f"{start_hint(settings)}") from exc


def running_stack_or_fail(settings: EngramSettings) -> str:
    """:func:`nats_url_or_fail`, and a :class:`CliError` too when the runtime file's `engram up` is
    gone: for commands that talk to the stack's graph, whose refused connection would say less."""
    url = nats_url_or_fail(settings)
    if _stale_runtime(settings):
        raise CliError(unreachable(settings, url, "not running"))
    return url


def _stale_runtime(settings: EngramSettings) -> int | None:
    """The supervisor pid of a runtime file whose `engram up` is gone (killed before it cleaned up)."""
    from engram.stack.embedded import pid_alive

    if settings.nats_url:
        return None
    try:
        pid = int(json.loads(settings.runtime_file.read_text()).get("supervisor_pid") or 0)
    except (OSError, ValueError, TypeError):
        return None
    return pid if pid and not pid_alive(pid) else None


@asynccontextmanager
async def nats_connection(settings: EngramSettings, name: str = "engram-cli") -> AsyncIterator[Any]:
    """A NATS connection to the stack ``settings`` point at, closed on exit; a :class:`CliError`
    that says what to do when there is no stack."""
    import nats

    url = nats_url_or_fail(settings)
    try:
        nc = await nats.connect(url, name=name, **quick_connect_options(), **settings.nats_options())
    except Exception as exc:  # noqa: BLE001 - every way of not connecting gets the same advice
        raise CliError(unreachable(settings, url, type(exc).__name__)) from exc
    try:
        yield nc
    finally:
        await nc.close()


def explain(exc: BaseException) -> str:
    """One line for an exception no command turned into a :class:`CliError`."""
    import nats.errors
    import nats.js.errors

    from pydantic import ValidationError

    if isinstance(exc, CliError):
        return str(exc)
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        if exc.title.endswith("Settings"):  # pydantic-settings: the environment holds a bad value
            return f"invalid setting ({problems}): fix the ENGRAM_* environment variable of that name"
        return f"{exc.title}: {problems}"
    if isinstance(exc, nats.errors.NoRespondersError):
        return "no engram service answered on NATS: start the stack with `engram up` (check it with `engram status`)"
    if isinstance(exc, nats.js.errors.NoStreamResponseError):
        return ("NATS has no engram streams yet: start engram once with `engram up` (any engram service creates "
                "them)")
    if isinstance(exc, nats.js.errors.NotFoundError):
        return (f"{exc.description or 'not found'} on NATS: start engram once with `engram up` (any engram service "
                "creates its streams)")
    if isinstance(exc, (nats.errors.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        return "no answer from engram in time: check the stack with `engram status`"
    if isinstance(exc, (nats.errors.ConnectionClosedError, nats.errors.NoServersError)):
        return "lost the connection to NATS: check the stack with `engram status`"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    return f"{type(exc).__name__}: {exc} (an unexpected error: run the command again with --debug for the traceback)"


# --- the Typer group every command runs in ----------------------------------------------------

def _is_click_error(exc: BaseException, name: str) -> bool:
    # typer vendors click (typer._click); its exception classes are matched by name, as typer does.
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def _set_debug(ctx: Any, _param: Any, value: bool) -> None:
    if value:
        ctx.meta[DEBUG_KEY] = True


def debug_option() -> TyperOption:
    return TyperOption(param_decls=["--debug"], is_flag=True, default=False, expose_value=False, is_eager=True,
                       callback=_set_debug, help="Show the full traceback when the command fails.")


class EngramGroup(TyperGroup):
    """Typer's group, plus: every command takes ``--debug``, and a failure becomes one line on
    stderr with a non-zero exit (the traceback only with ``--debug``). Commands added later get
    both without doing anything."""

    err = Console(stderr=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(debug_option())

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not any(p.name == "debug" for p in command.params):
            command.params.append(debug_option())
        return command

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if _is_click_error(exc, "NoArgsIsHelpError") or _is_click_error(exc, "Exit"):
                raise
            if _is_click_error(exc, "ClickException"):
                # bad arguments: click's message, and where the usage is
                where = getattr(getattr(exc, "ctx", None), "command_path", None) or ctx.command_path
                error_line(self.err, f"{exc.format_message()} (see `{where} --help`)")  # type: ignore[attr-defined]
                raise typer.Exit(getattr(exc, "exit_code", 2)) from exc
            if ctx.meta.get(DEBUG_KEY):
                raise
            error_line(self.err, explain(exc))
            raise typer.Exit(exc.code if isinstance(exc, CliError) else 1) from exc

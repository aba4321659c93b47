"""What every `engram mem …` command shares: the `mem_app` group, its options, error
handling and output helpers. The commands register on `mem_app` in `cli.commands.mem`
(reads and writes) and `cli.commands.mem_history` (history, audit, verdicts); each imports
this module and neither imports the other.

The command layer only: options, input caps, output formats and the exit-code contract
(0 ok, 1 bad input, not found or refused, 2 relay/network/timeout, 3 authentication,
4 other, 5 conflict, 6 the audit found a problem). Every operation is a call to
`cli.memory.api.AgentMemory`; its errors carry their exit code. Nothing here prints a
key; decrypted text goes only to stdout of `get`, `search` (snippets), `diff` and `patch
--dry-run`. History, audit and owner verdicts are in `cli.commands.mem_history`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from cli.memory.api import AgentMemory, SetReport
from cli.nostr.errors import AgentMemoryError, BadInputError, ConflictError
from cli.nostr.identity import load_identity, relay_urls
from cli.nostr.timeparse import format_time, parse_time
from engram import EngramError

T = TypeVar("T")
STDIN_CAP = 65_535  # the NIP-44 plaintext limit: no value can be longer than this
PATCH_CAP = 1 << 20
DEFAULT_TIMEOUT = 10.0
LIST_TIMEOUT = 60.0  # ls, refs, search: a complete listing may take many pages per relay
InputError = BadInputError


def fail(message: str, code: int) -> NoReturn:
    """Errors are exactly one line on stderr, then the exit code."""
    line = " ".join(message.split()) or "error"
    typer.echo(f"engram: {line}", err=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    typer.echo(f"engram: warning: {' '.join(message.split())}", err=True)


# typer exports BadParameter but not its base, UsageError (click's, or typer's vendored copy).
UsageError: type[Exception] = typer.BadParameter.__mro__[1]


class MemGroup(TyperGroup):
    """Maps exceptions to the exit-code contract in one place, usage errors included.

    click would exit 2 on a usage error and print a multi-line panel; here bad input is
    exit 1 and one line, so 2 keeps meaning "the relay or the network failed".
    """

    def invoke(self, ctx: Any) -> Any:
        with stdout_reader_may_leave():
            return self._invoke(ctx)

    def _invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, BrokenPipeError):
            raise  # typer's own handling: exit codes (stdout's closed pipe: see below)
        except UsageError as exc:
            fail(exc.format_message(), 1)  # type: ignore[attr-defined]
        except Exception as exc:
            if isinstance(exc, TimeoutError):  # from asyncio.timeout: its message is empty
                fail("timed out waiting for the relay", 2)
            if isinstance(exc, AgentMemoryError):
                text = f"conflict: {exc}" if isinstance(exc, ConflictError) else str(exc)
                fail(text, exc.exit_code)
            if isinstance(exc, EngramError):  # invalid slug, body too large: the user's input
                fail(str(exc), 1)
            fail(f"unexpected error: {type(exc).__name__}: {exc}", 4)


class _StdoutFd(io.RawIOBase):
    """stdout's file descriptor, for a reader that may leave early (`engram mem audit |
    head`). A closed pipe is not bad input: the first write that finds the reader gone
    points the descriptor at /dev/null (Python's SIGPIPE note), so the rest of the output,
    and the flush at exit, go nowhere instead of ending the command with exit 1; the
    command finishes and its own exit code stands."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        try:
            return os.write(self._fd, data)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._fd)
            os.close(devnull)
            return len(memoryview(data))


@contextlib.contextmanager
def stdout_reader_may_leave() -> Iterator[None]:
    """sys.stdout over `_StdoutFd` while a command runs, when stdout is a real descriptor
    (a test's captured stdout is left alone)."""
    before = sys.stdout
    try:
        fd = before.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        yield
        return
    before.flush()
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_StdoutFd(fd)),
        encoding=before.encoding,
        errors=before.errors,
        line_buffering=before.line_buffering,
    )
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = before


mem_app = typer.Typer(
    cls=MemGroup,
    help="Read and write agent memory (NIP-AE engrams) on one relay or a set of relays.",
    no_args_is_help=True,
)

Relay = Annotated[
    str | None,
    typer.Option(
        "--relay",
        help="Relay URL, or several separated by commas (env ENGRAM_RELAY; "
        "default ws://127.0.0.1:7777).",
    ),
]
Owner = Annotated[
    str | None, typer.Option("--owner", help="Owner public key, hex or npub (env ENGRAM_OWNER).")
]
KeyFile = Annotated[
    Path | None,
    typer.Option("--key-file", help="File holding the secret key (else env ENGRAM_PRIVATE_KEY)."),
]
Agent = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="Owner-side read: the key held is the owner's; read this agent's memory.",
    ),
]
Timeout = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds before giving up on the relays.")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of text lines.")]
SlugArg = Annotated[str, typer.Argument(help="Slug, e.g. notes/x (mem/ is added) or core.")]
Correct = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="Owner correction: the key held is the owner's; write to this agent's memory.",
    ),
]
TrustOpt = Annotated[
    str | None,
    typer.Option(
        "--trust",
        help="guess (the agent inferred it; the default) or stated (the user said so). "
        "The owner's values are always confirmed.",
    ),
]
SourceOpt = Annotated[
    str | None, typer.Option("--source", help="Where it came from: a session, a tool, a URL.")
]
ValidFrom = Annotated[
    str | None,
    typer.Option("--valid-from", metavar="TIME", help="The fact holds from TIME (unix s or ISO)."),
]
ValidUntil = Annotated[
    str | None,
    typer.Option("--valid-until", metavar="TIME", help="The fact holds until TIME (excluded)."),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Write a value a tombstone rejected, or over the owner's correction "
        "(never a value the owner denied).",
    ),
]
ValidNow = Annotated[
    bool, typer.Option("--valid-now", help="Hide facts not valid now (ended or not yet begun).")
]


def when(text: str | None, option: str) -> int | None:
    """A TIME option: unix seconds or ISO 8601 (UTC where no zone is given)."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        raise InputError(f"{option}: not unix seconds or an ISO 8601 time: {text!r}") from None


def trust_col(trust: str | None) -> str:
    return trust or "-"


def validity_col(valid_from: int | None, valid_until: int | None, ended: bool) -> str:
    """`-`, or `ended <until>` (marked, not hidden), or the window when one is set."""
    if ended and valid_until is not None:
        return f"ended {format_time(valid_until)}"
    parts = []
    if valid_from is not None:
        parts.append(f"from {format_time(valid_from)}")
    if valid_until is not None:
        parts.append(f"until {format_time(valid_until)}")
    return " ".join(parts) or "-"


def memory(
    relay: str | None,
    owner: str | None,
    key_file: Path | None,
    agent: str | None,
    timeout: float,
    one_shot: bool = True,
) -> AgentMemory:
    """The memory the flags name; `one_shot`: a command's run (a long-running server such
    as `engram review` keeps its recall index current in the background instead)."""
    return AgentMemory(
        load_identity(key_file, owner, agent), relay_urls(relay), timeout=timeout, one_shot=one_shot
    )


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def then_close(mem: AgentMemory, coro: Coroutine[Any, Any, T]) -> T:
    try:
        return await coro
    finally:
        await mem.close()


def report(rep: SetReport, as_json: bool = False, drop_sync_hint: bool = False) -> None:
    """Everything the user should know about the relays, on stderr: warning lines, or with
    `--json` one JSON object (`{"report": {"failed", "behind", "incomplete", "skipped", …}}`)
    when there is anything to say."""
    lines = [w for w in rep.warnings() if not (drop_sync_hint and "engram mem sync" in w)]
    if as_json:
        if lines:
            typer.echo(json.dumps({"report": rep.as_json()}), err=True)
        return
    for line in lines:
        warn(line)


def write_stdout(text: str) -> None:
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.buffer.flush()


def read_capped(stream: Any, cap: int, what: str) -> str:
    """Read at most `cap` bytes of UTF-8; more is an error, never a silent truncation."""
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise InputError(f"{what} is larger than {cap:,} bytes; nothing was written")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not valid UTF-8") from exc


def parse_slug(raw: str) -> str:
    return AgentMemory.slug(raw)


def print_written(result: Any) -> None:
    for url, reason in result.refused.items():
        warn(f"{url}: {reason}")
    rep: SetReport = result.report
    for line in rep.warnings():
        if not any(line.startswith(f"{url}: ") for url in result.refused):
            warn(line)
    typer.echo(result.event_id)

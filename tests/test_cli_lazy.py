"""`engram` builds only the subcommand it runs (cli.commands.lazy), and what it builds is
what typer builds when every subcommand is registered at start-up.

The process tests read `python -X importtime` of a real `engram` process: which modules it
imported, not how long that took (no timed assertion).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import typer
import typer.main
from cli_support import ENGRAM, ROOT, clean_env
from typer.core import TyperGroup
from typer.models import DefaultPlaceholder

from cli.commands.main import LAZY, ORDER, app

# Every command module behind a lazy subcommand, and what they import that others do not.
COMMAND_MODULES = {
    "cli.commands.acp",
    "cli.commands.data",
    "cli.commands.mcp",
    "cli.commands.mem",
    "cli.commands.mem_history",
    "cli.commands.ops",
    "cli.commands.review",
    "cli.commands.sync",
    "cli.commands.tenant",
}
LIBRARIES = {"cli.memory", "cli.memory.api", "relay.config", "relay.store", "relay.tenants"}


def eager_app() -> typer.Typer:
    """The root app with every subcommand registered at once, in the listed order (as
    before lazy loading), on typer's own group class."""
    eager = copy.copy(app)
    eager.info = copy.copy(app.info)
    eager.info.cls = TyperGroup
    eager.registered_commands, eager.registered_groups = [], []
    own = {c.name or c.callback.__name__: c for c in app.registered_commands if c.callback}
    own_groups = {g.name: g for g in app.registered_groups}
    for name in ORDER:
        if name in LAZY:
            LAZY[name](eager)
        elif name in own:
            eager.registered_commands.append(own[name])
        else:
            eager.registered_groups.append(own_groups[name])
    return eager


def shape(value: Any, depth: int = 0) -> Any:
    """A comparable picture of a click command or parameter: its settings, help, options,
    types and defaults; a callback by the function typer wrapped."""
    assert depth < 12, "unexpectedly deep"
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [shape(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: shape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, DefaultPlaceholder):
        return ("default", shape(value.value, depth + 1))
    if callable(value) and hasattr(value, "__qualname__"):
        inner = getattr(value, "__wrapped__", value)
        return f"{inner.__module__}.{inner.__qualname__}"
    if hasattr(value, "__dict__"):
        fields = {k: v for k, v in vars(value).items() if k not in ("commands", "_runtime_param")}
        kind = getattr(type(value), "eager_class", type(value))  # a lazy group: its base
        return (kind.__qualname__, shape(fields, depth + 1))
    return repr(value)


def tree(command: Any, path: str = "engram") -> dict[str, Any]:
    """Every command under `command` by its path, each with its shape."""
    out = {path: shape(command)}
    commands = getattr(command, "commands", None)
    if commands is not None:
        out[path + " (order)"] = list(commands)
        for name in list(commands):
            out |= tree(commands[name], f"{path} {name}")
    return out


def registrations() -> list[tuple[Any, Any]]:
    """The sub-groups registered on the command modules' Typers, as registered."""
    from cli.commands.mem_common import mem_app
    from cli.commands.ops import config_app
    from cli.commands.tenant import tenant_app

    groups = [g for t in (mem_app, config_app, tenant_app) for g in t.registered_groups]
    return [(g.typer_instance, g.cls, list(g.typer_instance.registered_commands)) for g in groups]


def test_the_lazy_tree_is_the_eager_tree() -> None:
    before = registrations()
    lazy_root = typer.main.get_command(app)
    lazy = tree(lazy_root)  # builds every command, lazily
    assert registrations() == before  # the apps' own registrations are left as they were
    eager_root = typer.main.get_command(eager_app())
    assert type(eager_root) is TyperGroup and type(lazy_root) is not TyperGroup
    eager = tree(eager_root)
    assert lazy["engram (order)"] == list(ORDER)
    assert lazy.keys() == eager.keys()
    assert len(lazy) > 60  # every command of every group, not just the root
    for path in eager:
        assert lazy[path] == eager[path], path


def test_asking_for_a_name_builds_only_that_subcommand() -> None:
    root = typer.main.get_command(app)
    assert "keygen" in root.commands and "nope" not in root.commands
    assert root.commands.get("nope") is None
    assert list(root.commands) == list(ORDER)  # membership and listing build nothing
    assert root.commands.built() == ["serve", "bench", "migrate", "db"]  # main's own
    assert root.commands["keygen"].name == "keygen"
    mem = root.commands["mem"]
    assert root.commands.built() == ["keygen", "serve", "bench", "migrate", "mem", "db"]
    assert mem.commands.built() == [] and len(mem.commands) == 20
    assert mem.commands["get"].callback.__wrapped__.__qualname__ == "get"
    assert mem.commands.built() == ["get"]
    tenant = root.commands["tenant"]  # its moderation commands are added without a group name
    assert "ban" in tenant.commands and tenant.commands.built() == []
    assert tenant.commands["admin"].commands.built() == []
    assert tenant.commands.built() == ["admin"]


def imported(*args: str, stdin: bytes = b"") -> tuple[subprocess.CompletedProcess[bytes], set]:
    """Run `engram ARGS` as a real process; its result and the modules it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *ENGRAM[1:], *args],
        input=stdin,
        capture_output=True,
        env=clean_env(),
        cwd=ROOT,
        timeout=120,
    )
    modules = {
        line.split("|")[-1].strip()
        for line in proc.stderr.decode().splitlines()
        if line.startswith("import time:")
    }
    return proc, modules


def test_keygen_imports_no_other_command_and_no_library_it_does_not_use() -> None:
    proc, modules = imported("keygen")
    assert proc.returncode == 0 and b"npub" in proc.stdout
    assert "cli.commands.ops" in modules
    assert modules & (COMMAND_MODULES - {"cli.commands.ops"}) == set()
    assert modules & LIBRARIES == set()


def test_a_mem_command_imports_the_memory_library_and_no_relay_or_other_command() -> None:
    proc, modules = imported("mem", "hash")  # no slug: a usage error, after the build
    assert proc.returncode == 1 and b"engram: Missing argument 'slug'." in proc.stderr
    assert {"cli.commands.mem", "cli.commands.mem_history", "cli.memory.api"} <= modules
    others = COMMAND_MODULES - {"cli.commands.mem", "cli.commands.mem_history"}
    assert modules & others == set()
    assert modules & {"relay.config", "relay.store", "relay.tenants"} == set()


def test_help_lists_every_subcommand_so_it_imports_them_all() -> None:
    proc, modules = imported("--help")
    assert proc.returncode == 0
    assert modules >= COMMAND_MODULES
    rows = [line for line in proc.stdout.decode().splitlines() if line.startswith("│ ")]
    named = [row.split()[1] for row in rows if row[2] != " "]  # not a help text's next line
    assert named == ["--help", *ORDER]


def test_an_unknown_subcommand_builds_none_and_still_gets_a_suggestion() -> None:
    proc, modules = imported("mme")
    assert proc.returncode == 2
    assert "No such command 'mme'. Did you mean 'mem'?" in proc.stderr.decode()
    assert modules & COMMAND_MODULES == set()

"""`engram` is pure: importing it (in a fresh interpreter) loads no event loop, network,
TLS, database or web framework module; and its source never reaches for the clock, the
OS randomness source, files or the environment."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import engram

FORBIDDEN_MODULES = ("asyncio", "socket", "ssl", "selectors", "asyncpg", "starlette", "uvicorn")
FORBIDDEN_IMPORTS = {"asyncio", "socket", "ssl", "os", "time", "datetime", "random", "secrets"}
FORBIDDEN_IMPORTS |= {"asyncpg", "starlette", "uvicorn", "websockets", "relay", "cli", "pathlib"}
FORBIDDEN_CALLS = {"open", "print", "input"}
PACKAGE = Path(engram.__file__).parent


def loaded_after_import(modules: str) -> list[str]:
    """Forbidden modules present in a fresh interpreter after `import <modules>`."""
    code = (
        f"import sys, {modules}\n"
        f"print(','.join(m for m in {FORBIDDEN_MODULES!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return [m for m in result.stdout.strip().split(",") if m]


def test_importing_engram_loads_no_io_modules() -> None:
    modules = "engram, engram.nip01, engram.nip19, engram.nip44, engram.nipoa"
    assert loaded_after_import(modules) == []


def test_relay_wire_is_sans_io() -> None:
    """The relay's codec builds on engram and must stay sans-I/O too (docs/ARCHITECTURE.md §1)."""
    assert loaded_after_import("relay.wire") == []


def test_control_the_probe_detects_a_loaded_module() -> None:
    assert "asyncio" in loaded_after_import("asyncio")


def _imports_and_calls(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports: set[str] = set()
    calls: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imports.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.add(node.func.id)
    return imports, calls


def test_engram_source_has_no_clock_randomness_or_io() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        imports, calls = _imports_and_calls(path)
        assert not imports & FORBIDDEN_IMPORTS, f"{path.name} imports {imports & FORBIDDEN_IMPORTS}"
        assert not calls & FORBIDDEN_CALLS, f"{path.name} calls {calls & FORBIDDEN_CALLS}"


# --- imports run one way: engram <- relay <- cli <- bench ---------------------------------

CLI = PACKAGE.parent / "cli"


def _module_imports(path: Path) -> set[str]:
    """Every module a file imports, dotted in full (`from a.b import c` gives `a.b`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_cli_never_imports_bench() -> None:
    """`engram bench` runs `python -m bench` in a process of its own."""
    for path in sorted(CLI.rglob("*.py")):
        bad = {m for m in _module_imports(path) if m.split(".")[0] == "bench"}
        assert not bad, f"cli/{path.name} imports {bad}"


# cli/ is three rooms (docs/ARCHITECTURE.md §7): the commands, the Nostr client layer, the
# agent-memory library. Which may import which:
CLI_ROOMS: dict[str, set[str]] = {
    # the client layer speaks the protocol: engram only (never the relay, never the rooms
    # above), and the one home of the user's data directory (relay.dirs, a leaf)
    "nostr": {"engram", "cli.nostr", "relay.dirs"},
    # the memory library: the client layer, the protocol, and the relay's uvicorn Server class
    # (relay.server) for the review page; never a command
    "memory": {"engram", "cli.nostr", "cli.memory", "relay.server"},
    # the commands: anything but bench
    "commands": {"engram", "relay", "cli.nostr", "cli.memory", "cli.commands"},
}
PROJECT_TOPS = ("engram", "relay", "cli", "bench")


def _allowed(module: str, allowed: set[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def test_cli_has_exactly_the_three_rooms() -> None:
    """Every module of cli/ lives in one room; nothing sits loose beside them."""
    loose = [p.name for p in CLI.glob("*.py") if p.name != "__init__.py"]
    assert loose == [], loose
    rooms = {p.name for p in CLI.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == set(CLI_ROOMS), rooms


def test_each_cli_room_imports_only_what_it_may() -> None:
    for room, allowed in CLI_ROOMS.items():
        files = sorted((CLI / room).rglob("*.py"))
        assert files, room
        for path in files:
            ours = {m for m in _module_imports(path) if m.split(".")[0] in PROJECT_TOPS}
            bad = {m for m in ours if not _allowed(m, allowed)}
            assert not bad, f"{path.relative_to(CLI)} ({room}) imports {bad}"


def test_the_libraries_import_no_command_framework() -> None:
    """The client layer and `AgentMemory` are libraries: no typer, no click."""
    for room in ("nostr", "memory"):
        for path in sorted((CLI / room).rglob("*.py")):
            imports = {m.split(".")[0] for m in _module_imports(path)}
            assert not imports & {"typer", "click"}, path


def test_control_the_room_rule_catches_a_command_import() -> None:
    assert not _allowed("cli.commands.mem", CLI_ROOMS["memory"])
    assert not _allowed("relay.config", CLI_ROOMS["nostr"])
    assert _allowed("cli.nostr.client", CLI_ROOMS["memory"])


def test_the_head_rule_is_stated_once() -> None:
    """The client breaks head ties through `engram.head`, never with its own sort key."""
    for path in sorted(CLI.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "-e.created_at, e.id" not in text and "select_head(" not in text, path.name


# --- bench: commands over a library ------------------------------------------------------

BENCH = PACKAGE.parent / "bench"


def _bench_imports(path: Path) -> set[str]:
    """The bench modules a file imports (`from bench import x` counts as `bench.x`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("bench."))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "bench":
                out.update(f"bench.{a.name}" for a in node.names)
            elif node.module.startswith("bench."):
                out.add(node.module)
    return out


def test_bench_commands_import_the_library_not_each_other() -> None:
    """`python -m bench <command>` modules share bench's library modules (results,
    procwatch, lanes, workload, ...); one command never imports another."""
    from bench.__main__ import COMMANDS

    commands = {f"bench.{name}" for name in COMMANDS}
    for path in sorted(BENCH.glob("*.py")):
        bad = _bench_imports(path) & commands - {f"bench.{path.stem}"}
        assert not bad, f"bench/{path.name} imports the command module(s) {bad}"

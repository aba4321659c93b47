"""A typer group whose subcommands are imported and built only when they are used.

Why: tests and scripts start hundreds of `engram` processes, and each one imported every
command module and the libraries behind them (the memory library, relay settings, tenants,
ACP, MCP) and turned all ~65 commands into click commands before doing anything: about
half a second of CPU per process, most of it for commands that did not run. Here the root
group knows each subcommand by name and builds only the one that is asked for.

Help and completion list every subcommand, so they build them all, in the declared order:
the output is the same. Each lazy subcommand is a function that registers it on a Typer
with the same `command()` / `add_typer()` call an eager registration makes, and typer
builds the click command from that registration, so it is the command typer would have
built at start-up (tests/test_cli_lazy.py compares the two trees).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

Register = Callable[[typer.Typer], None]  # registers one subcommand (command or group)


class LazyCommands(MutableMapping[str, Any]):
    """Subcommand name -> click command, in `order`; a lazy one is built on first access.

    Membership and iteration (what a typo suggestion or a README check asks) build nothing.
    """

    def __init__(
        self,
        order: Sequence[str],
        built: Mapping[str, Any],
        lazy: Mapping[str, Register],
        build: Callable[[str, Register], Any],
    ) -> None:
        if set(order) != set(built) | set(lazy) or set(built) & set(lazy):
            raise ValueError(
                f"subcommands {sorted(order)} are not the eager {sorted(built)}"
                f" plus the lazy {sorted(lazy)}"
            )
        self._order = list(order)
        self._built = dict(built)
        self._lazy = dict(lazy)
        self._build = build

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            register = self._lazy[name]  # KeyError: no such subcommand
            self._built[name] = self._build(name, register)
            del self._lazy[name]
        return self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self:
            self._order.append(name)
        self._lazy.pop(name, None)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._order.remove(name)
        self._lazy.pop(name, None)
        self._built.pop(name, None)


def lazy_group(order: Sequence[str], lazy: Mapping[str, Register]) -> type[TyperGroup]:
    """A TyperGroup class (for `typer.Typer(cls=...)`) listing `order`: the subcommands
    registered on its Typer the usual way, plus those of `lazy`, built on first use."""

    class LazyGroup(TyperGroup):
        def __init__(self, *, commands: Mapping[str, Any] | None = None, **attrs: Any) -> None:
            super().__init__(**attrs)  # typer's group, then its commands made lazy
            self.commands = LazyCommands(order, commands or {}, lazy, self._build)

        def _build(self, name: str, register: Register) -> Any:
            """What typer builds for this registration under this group's settings (the
            root app keeps typer's default `pretty_exceptions_short`, as this Typer does)."""
            scratch = typer.Typer(
                rich_markup_mode=self.rich_markup_mode, suggest_commands=self.suggest_commands
            )
            register(scratch)
            return typer.main.get_group(scratch).commands[name]

    return LazyGroup

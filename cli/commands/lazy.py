"""A typer group whose subcommands are imported and built only when they are used.

Why: tests and scripts start hundreds of `engram` processes, and each one imported every
command module and the libraries behind them (the memory library, relay settings, tenants,
ACP, MCP) and turned all ~65 commands into click commands before doing anything: about
half a second of CPU per process, most of it for commands that did not run. Here the root
group knows each subcommand by name and builds only the one that is asked for.

Sub-groups (`mem`, `tenant`, …) are built the same way: `engram mem get` builds the `mem`
group and its `get`, not the other 19 `mem` commands (typer spends ~2 ms of CPU reading
each command's signature). Help and completion list every subcommand, so they build them
all, in the declared order: the output is the same.

Each lazy subcommand is a function that registers it on a Typer with the same `command()`
/ `add_typer()` call an eager registration makes (a sub-group's: its own registration),
and typer builds the click command from that, so it is the command typer would have built
at start-up (tests/test_cli_lazy.py compares the two trees).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup
from typer.models import TyperInfo

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

    def built(self) -> list[str]:
        """The subcommands built so far, in order (what a test checks)."""
        return [name for name in self._order if name in self._built]

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


def lazy_group(
    order: Sequence[str], lazy: Mapping[str, Register], base: type[TyperGroup] = TyperGroup
) -> type[TyperGroup]:
    """A `base` group class (for `typer.Typer(cls=...)`) listing `order`: the subcommands
    registered on its Typer the usual way, plus those of `lazy`, built on first use."""

    class LazyGroup(base):  # type: ignore[valid-type,misc]
        eager_class = base  # what typer builds without lazy loading (tests compare)

        def __init__(self, *, commands: Mapping[str, Any] | None = None, **attrs: Any) -> None:
            super().__init__(**attrs)  # typer's group, then its commands made lazy
            self.commands = LazyCommands(order, commands or {}, lazy, self._build)

        def _build(self, name: str, register: Register) -> Any:
            """What typer builds for this registration under this group's settings (the
            root app keeps typer's default `pretty_exceptions_short`, as this Typer does).
            A sub-group is built with its own subcommands left for their first use."""
            scratch = typer.Typer(
                rich_markup_mode=self.rich_markup_mode, suggest_commands=self.suggest_commands
            )
            register(scratch)
            for info in scratch.registered_groups:
                defer_subcommands(info)
            return typer.main.get_group(scratch).commands[name]

    return LazyGroup


def defer_subcommands(info: TyperInfo) -> None:
    """Make the group registered as `info` build its subcommands on first use: typer gets
    a copy of its Typer without them, on a lazy class of the group's own class."""
    sub = info.typer_instance
    entries = subcommands(sub) if isinstance(sub, typer.Typer) else None
    if not entries:
        return  # built at once, as typer does
    base = typer.main.solve_typer_info_defaults(info).cls or TyperGroup
    shell = copy.copy(sub)
    shell.registered_commands, shell.registered_groups = [], []
    info.typer_instance = shell
    info.cls = lazy_group([name for name, _ in entries], dict(entries), base)


def subcommands(app: typer.Typer) -> list[tuple[str, Register]] | None:
    """Each subcommand typer builds for `app`, in typer's order (its commands, then its
    groups, a group added without a name contributing its own subcommands), with how to
    register it alone; None when a name is not known before building."""
    out: list[tuple[str, Register]] = []
    for command in app.registered_commands:
        if command.callback is None:
            return None
        name = command.name or typer.main.get_command_name(command.callback.__name__)
        out.append((name, lambda app, command=command: app.registered_commands.append(command)))
    for group in app.registered_groups:
        name = typer.main.solve_typer_info_defaults(group).name
        if name:
            # a copy: defer_subcommands changes the registration it builds, not the app's
            out.append((name, lambda app, g=group: app.registered_groups.append(copy.copy(g))))
            continue
        inner = subcommands(group.typer_instance) if group.typer_instance else None
        if inner is None:
            return None
        out += inner
    names = [name for name, _ in out]
    return out if len(set(names)) == len(names) else None

"""Who may read an operator's page (`/metrics`): addresses, networks and host names.

Host names are for scrapers whose address is not fixed (a Prometheus container found
by its service name): they are resolved when asked, and the answer is kept a minute.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?"  # "_": compose service names
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
RESOLVE_SECONDS = 60.0  # how long a resolved name's addresses are kept
UNRESOLVED_SECONDS = 5.0  # ... and a name that did not resolve (its scraper is not up yet)
RESOLVE_TIMEOUT = 2.0  # a lookup that takes longer counts as not resolved


def parse_allowlist(entries: Iterable[str], setting: str) -> tuple[list[Network], list[str]]:
    """(networks, host names); ValueError naming `setting` for an entry that is neither."""
    networks: list[Network] = []
    names: list[str] = []
    for raw in entries:
        entry = raw.strip()
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        if not _HOST_NAME.fullmatch(entry) or entry.replace(".", "").isdigit():
            raise ValueError(
                f"{setting}: {raw!r} is not an address, a network (CIDR) or a host name"
            )
        names.append(entry.lower())
    return networks, names


def _address(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped  # an IPv4 peer on a dual-stack socket
    return addr


class Allowlist:
    """`await allows(ip)`: the peer address is on the list (resolving names as needed)."""

    def __init__(self, entries: Iterable[str], setting: str) -> None:
        self.networks, self.names = parse_allowlist(entries, setting)
        self._resolved: dict[str, tuple[float, frozenset[str]]] = {}
        self._lookups: dict[str, asyncio.Future[frozenset[str]]] = {}  # one in flight a name

    async def allows(self, ip: str) -> bool:
        addr = _address(ip)
        if addr is None:
            return False
        if any(addr in net for net in self.networks):
            return True
        for name in self.names:
            if str(addr) in await self._addresses(name):
                return True
        return False

    async def _addresses(self, name: str) -> frozenset[str]:
        """The name's addresses, kept a while; one lookup at a time per name, with a
        deadline (any request from an unlisted address may ask, so a slow resolver must
        not pile up lookups)."""
        now = time.monotonic()
        cached = self._resolved.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        lookup = self._lookups.get(name)
        if lookup is None:
            lookup = self._lookups[name] = asyncio.ensure_future(self._resolve(name))
            lookup.add_done_callback(lambda _: self._lookups.pop(name, None))
        return await asyncio.shield(lookup)

    async def _resolve(self, name: str) -> frozenset[str]:
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM),
                RESOLVE_TIMEOUT,
            )
            found = frozenset(
                str(a) for info in infos if (a := _address(str(info[4][0]))) is not None
            )
        except (OSError, TimeoutError):
            found = frozenset()
        wait = RESOLVE_SECONDS if found else UNRESOLVED_SECONDS
        self._resolved[name] = (time.monotonic() + wait, found)
        return found

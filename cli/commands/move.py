"""`engram tenant move HOST --to URL`: a tenant's events to another database, live.

1. Note the source's tail position, then copy every event of the tenant through the
   export/import path (`export_raw`, then `Relay.admit`: ids and signatures verified, the
   replace and deletion rules applied, re-runs harmless).
2. Copy what was committed meanwhile (the tail since the noted position), until little is
   left; then switch the tenant over (`tenants.database_url`), which every relay node
   picks up within `tenant_refresh_seconds`.
3. Keep copying the tail for `--grace` seconds: writes of nodes that had not switched yet
   still land in the source and are carried over, so no accepted write is lost.

The source rows stay unless `--purge-source` (deleted after the grace period).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from relay.config import Settings

CHUNK = 1_000  # events per import chunk
_QUIET = 100  # a tail pass with fewer events than this is "little left": switch over
_PASSES = 50  # tail passes at most before switching regardless


@dataclass
class MoveReport:
    copied: int = 0  # events imported by the bulk copy
    caught_up: int = 0  # events imported from the tail (written during the copy)
    rejected: int = 0  # events the import refused (reasons in the log line)
    source_events: int = 0
    target_events: int = 0
    purged: int = 0


async def _chunks(raws: AsyncIterator[bytes] | list[bytes]) -> AsyncIterator[list[bytes]]:
    chunk: list[bytes] = []
    if isinstance(raws, list):
        for i in range(0, len(raws), CHUNK):
            yield raws[i : i + CHUNK]
        return
    async for raw in raws:
        chunk.append(raw)
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _copy_limits(tenant: Any) -> Any:
    """The tenant with limits that refuse nothing already stored (sizes and age may have
    been changed since); ids and signatures are still verified."""
    big = 1 << 40
    limits = msgspec.structs.replace(
        tenant.limits,
        created_at_lower_limit=0,
        created_at_upper_limit=big,
        max_content_length=big,
        max_event_tags=big,
        max_message_length=big,
        min_pow_difficulty=0,
    )
    return msgspec.structs.replace(tenant, limits=limits)


class _Copy:
    """The tenant's events from the source into the target store, through the import
    path (`Relay.admit`: ids and signatures verified, replace and deletion rules applied),
    counted in one `ImportSummary`."""

    def __init__(self, settings: Settings, store: Any, cfg: Any, src: Any, host: str) -> None:
        from cli.commands.data import ImportSummary
        from relay.pipeline import Relay
        from relay.tenants import TenantRegistry, build_tenant

        self.src = src
        self.host = host
        self.tenant = _copy_limits(build_tenant(cfg, settings))
        self.relay = Relay(settings, store, tenants=TenantRegistry(settings))
        self.summary = ImportSummary()

    async def __call__(self, raws: AsyncIterator[bytes] | list[bytes], strict: bool = True) -> int:
        """Import; before the switch a database error aborts the move (nothing changed
        yet), after it the copy goes on and the errors are reported."""
        from cli.commands.data import import_lines
        from relay.store import StoreError

        summary = self.summary
        before = summary.imported + summary.duplicates
        await import_lines(self.relay, self.tenant, _chunks(raws), summary=summary)
        if strict and summary.errors:
            raise StoreError(f"error: {summary.errors} events could not be stored")
        return summary.imported + summary.duplicates - before

    async def catch_up(self, position: Any) -> tuple[Any, int]:
        """What was written during the copy, pass by pass until little is left (at most
        `_PASSES` passes); returns the new tail position and the events copied."""
        from relay.store import move as mv

        copied = 0
        for _ in range(_PASSES):
            position, raws = await mv.changed_since(self.src, self.host, position)
            copied += await self(raws)
            if len(raws) < _QUIET:
                break
        return position, copied

    async def carry_over(self, position: Any, grace: float) -> int:
        """After the switch: late writes of nodes that had not switched yet, for `grace`
        seconds."""
        from relay.store import move as mv

        copied = 0
        deadline = time.monotonic() + grace
        while True:
            position, raws = await mv.changed_since(self.src, self.host, position)
            copied += await self(raws, strict=False)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        return copied


async def _tenant_on_source(control: Any, host: str, control_url: str, target_url: str) -> Any:
    """The tenant's configuration, refused when it does not exist or is already there."""
    from relay.store import StoreError
    from relay.store import tenants as db

    cfg = await db.get_tenant(control, host)
    if cfg is None:
        raise StoreError(f"no tenant {host}")
    if (cfg.database_url or control_url) == target_url:
        raise StoreError(f"{host} is already on that database")
    return cfg


async def move_tenant(
    settings: Settings,
    control_url: str,
    host: str,
    target: str,
    grace: float,
    purge_source: bool,
    merge: bool,
    say: Callable[[str], None],
) -> MoveReport:
    from relay.store import StoreError
    from relay.store import maintenance as m
    from relay.store import move as mv
    from relay.store import tenants as db
    from relay.store.migrate import migrate_url
    from relay.store.postgres import PostgresStore

    target_url = control_url if target == "default" else target
    try:
        await migrate_url(target_url)
    except Exception as exc:
        raise StoreError(f"error: cannot prepare the target database: {exc}") from exc
    report = MoveReport()
    control = await mv.connect(control_url)
    try:
        cfg = await _tenant_on_source(control, host, control_url, target_url)
        src = await mv.connect(cfg.database_url or control_url)
        dst = await mv.connect(target_url)
        store = await PostgresStore.open(
            target_url, msgspec.structs.replace(settings, replica_urls=[])
        )
        try:
            present = await db.event_count(dst, host)
            if present and not merge:
                raise StoreError(
                    f"the target already holds {present} events of {host} (an earlier copy?);"
                    " pass --merge to copy into it anyway"
                )
            copy = _Copy(settings, store, cfg, src, host)
            position = await mv.position(src)
            say(f"copying {host} to the target database…")
            report.copied = await copy(m.export_raw(src, host))
            position, report.caught_up = await copy.catch_up(position)
            await db.update_tenant(
                control, host, database_url=None if target_url == control_url else target_url
            )
            say(f"switched {host}; carrying over late writes for {grace:g} s…")
            report.caught_up += await copy.carry_over(position, grace)
            report.rejected = sum(copy.summary.rejected.values())
            for prefix, example in sorted(copy.summary.examples.items()):
                say(f"  rejected ({prefix}): {example}")
            report.source_events = await db.event_count(src, host)
            report.target_events = await db.event_count(dst, host)
            if purge_source:
                report.purged = await mv.purge_tenant_events(src, host)
        finally:
            await store.close()
            await src.close()
            await dst.close()
    finally:
        await control.close()
    return report

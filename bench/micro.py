"""Per-operation micro-benchmarks of the protocol core: `python -m bench.micro`.

Prints the machine and library versions first, because a figure without them means
nothing. Each case is a (name, zero-argument callable) in `cases()`; to add one (e.g. a
relay frame decode or filter match), append to that list. Figures are indicative: one
process, warm caches, perf_counter loops sized to ~0.3 s per case. Nothing is asserted.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from importlib.metadata import version

from engram import nip44
from engram.body import Memory, encode_body, parse_body
from engram.envelope import build_event, validate_and_decrypt, validate_engram_envelope
from engram.nip01 import event_id, pubkey_of, sign_event, verify_event
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


def main() -> None:
    print(header())
    print(f"{'operation':<42} {'us/op':>10} {'ops/s':>12}")
    for name, fn in cases():
        seconds = measure(fn)
        print(f"{name:<42} {seconds * 1e6:>10.2f} {1 / seconds:>12,.0f}", flush=True)


if __name__ == "__main__":
    main()

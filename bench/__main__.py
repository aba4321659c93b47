"""`python -m bench <command> ...`: the benchmark suite's entry point.

`main(argv)` is what `engram bench` mounts; it returns the exit status. Each command is a
module of this package with a `main(argv) -> int | None`, imported only when it runs.
"""

from __future__ import annotations

import importlib
import sys

# command -> what it measures (the module `bench.<command>` runs it)
COMMANDS: dict[str, str] = {
    "micro": "per-operation costs and ops/s of the protocol core and the store on this machine",
    "load": "drive a running relay (--url ws://127.0.0.1:PORT) and report each phase",
    "compare": "start this relay and the peer relays on loopback, load each, print ratios",
    "crossnode": "publish -> delivery latency between two relay processes on one PostgreSQL",
    "soak": "relay memory over a long mixed run (default 10 minutes)",
    "stalled": "relay memory with 1,000 subscribers that stopped reading, under a burst",
    "memls": "`engram mem ls` of 5,000 memories on a set of 3 relays",
    "scale": "REQ latency, ingest CPU and disk use of engram serve at 10k, 100k and 1M events",
    "negentropy": "NIP-77: reconcile two relays' stores of 100,000 events differing by 1%",
    "replicas": "bench load on one PostgreSQL primary, then with a streaming read replica",
    "pgindex": "PostgreSQL CPU per stored event with each index of `events` removed in turn",
    "flood": "one client's authors REQ latency while 8 connections flood costly REQs",
    "recall": "recall quality (held-out questions) and speed/size at 1k, 10k, 100k memories",
    "abuse": "other clients' EVENT and REQ latency under a live-search flood and 41 KB tag REQs",
    "tagvalues": "a REQ's latency by how many tag values it names (16, 256, 1,024)",
    "prefill": "a kept store of N events that compare --prefill N starts ours from",
    "ab": "a bench command alternated on two checkouts' relays: rounds, medians, interval",
    "crowd": "10,000 connections: connect and reconnect storms, fan-out, RSS per connection",
}

USAGE = (
    "usage: python -m bench <command> [options]\n\ncommands:\n"
    + "\n".join(f"  {name:<11} {what}" for name, what in COMMANDS.items())
    + "\n\n`python -m bench <command> --help` shows each command's options."
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{command}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())

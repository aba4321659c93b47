"""`python -m bench <micro|load|compare> ...`: the benchmark suite's entry point.

`main(argv)` is what `engram bench` mounts; it returns the exit status.
"""

from __future__ import annotations

import sys

USAGE = """usage: python -m bench <command> [options]

commands:
  micro     per-operation costs and ops/s of the protocol core and the store on this machine
  load      drive a running relay (--url ws://127.0.0.1:PORT) and report each phase
  compare   start this relay and the peer relays on loopback, load each, print ratios
  crossnode publish -> delivery latency between two relay processes on one PostgreSQL
  soak      relay memory over a long mixed run (default 10 minutes)
  negentropy  NIP-77: reconcile two relays' stores of 100,000 events differing by 1%

`python -m bench <command> --help` shows each command's options."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command == "micro":
        from bench import micro

        return micro.main(rest) or 0
    if command == "load":
        from bench import load

        return load.main(rest)
    if command == "compare":
        from bench import compare

        return compare.main(rest)
    if command == "soak":
        from bench import soak

        return soak.main(rest)
    if command == "negentropy":
        from bench import negentropy

        return negentropy.main(rest)
    if command == "crossnode":
        from bench import crossnode

        return crossnode.main(rest)
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

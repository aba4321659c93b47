"""`python -m bench load --url ws://127.0.0.1:7777`: drive a relay and report each phase.

Phases (the standard profile in `Profile`):
  kind1       EVENT ingest, kind 1 from 1,000 authors: N connections x a window in flight
              (`--content synthetic`: short texts of 25 words, one `t` value for all;
              `realistic`: ~200-byte contents of a Zipf vocabulary, a Zipf `t` tag)
  engram      EVENT ingest of valid kind-30174 engrams, replacing a hot set of addresses
  req         REQ {"authors":[k],"limit":10}, each closed after its EOSE
  probe       the same REQ with fewer in flight (`--probe-window`, default 1): latency
              when the relay is not queueing (not in the standard profile)
  head        the CLI's engram head fetch (kinds, authors, #p, #d) from connections
              authenticated (NIP-42) as the agent, when the relay sends a challenge
  fanout<S>   S subscribers (one connection each) while one publisher sends R events/s

Profiles (`--profile`; options given override them): standard (the phases above but
probe, at the defaults shown), sustained (issue 47: 200,000 realistic kind-1 EVENTs,
8 connections x 100 in flight, a fresh connection every 5,000 EVENTs, CPU of the relay
and of PostgreSQL and latency per 100,000 answers: `--chunk-events`) and reads (issue 48:
40,000 realistic notes, 30,000 REQs 8 x 8, a probe of 2,000 REQs 8 x 1). To load a relay
on a big store: `python -m bench prefill --size 1000000 --serve` serves a copy of a kept
one and prints the command.

Every frame is signed and encoded before the clock starts (events come from the file
cache of bench.events); connections are opened and authenticated before it too. Each
phase reports throughput, p50/p99/max latency (EVENT -> OK, REQ -> EOSE, publish ->
delivery), errors by reason, and, given the relay's PID, its CPU per operation and RSS
(the PID's whole process tree; `--pg-pid` adds a PostgreSQL postmaster's tree). The
generator's own CPU per operation is printed too, to show it is not the bottleneck.

The REQ and head phases read what the ingest phases wrote: run them in that order on a
relay whose store starts empty, or at least without these events (same seed = same
events = "duplicate" answers, which the report shows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.lanes import raise_fd_limit, run_async
from bench.results import format_results, phase_json
from bench.workload import add_profile_args, profile_from_args, run_load


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m bench load")
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--url", required=True, help="relay websocket URL (ws://127.0.0.1:PORT)")
    p.add_argument("--pid", type=int, help="relay PID: report its CPU per op and RSS")
    p.add_argument("--pg-pid", type=int, help="PostgreSQL postmaster PID: report its CPU")
    p.add_argument("--json", type=Path, help="also write every phase's figures into this file")
    add_profile_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    profile = profile_from_args(args)
    host = (args.url.split("//", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]).strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
        print(f"refusing to load {args.url}: loopback only", file=sys.stderr)
        return 2
    raise_fd_limit()
    print(
        f"load {args.url} (seed {profile.seed}, phases {','.join(profile.phase_names())},"
        f" client {profile.client})"
    )
    results = run_async(run_load(args.url, profile, args.pid, args.pg_pid, print))
    print()
    print(format_results(results))
    if args.json:
        data = {"url": args.url, "phases": [phase_json(r) for r in results]}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    # kind-1 events are all distinct, so a "duplicate" there means the relay had them already
    # (in the engram phase, "duplicate" also answers an older version losing to a newer one).
    dup = sum(
        n
        for r in results
        if r.phase == "kind1"
        for why, n in r.notes.items()
        if why.startswith("duplicate")
    )
    if dup:
        print(
            f"\nnote: {dup} EVENTs were already stored (same seed as an earlier run):"
            " use --seed N or a fresh relay store for meaningful ingest figures"
        )
    return 0

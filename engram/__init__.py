"""The engram protocol core: NIP-01 events, NIP-44 v2 encryption, NIP-AE agent memory.

Pure: no I/O, no asyncio, no clock and no randomness of its own. Time, nonces and
Schnorr aux are arguments; the relay and CLI supply them.
"""

"""The Nostr client layer: connections to relays (NIP-01, NIP-42, NIP-11), relay sets,
paging a REQ to the end, NIP-77 reconciliation, keys and URLs from flags, the CLI's error
classes, TIME arguments and private files. The commands and the memory library import it;
it imports neither (only `engram`)."""

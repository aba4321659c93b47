"""Host names as tenants are keyed: from a URL, a Host header or a NIP-42 `relay` tag.

A leaf module: tenant binding (`relay.tenants`) and AUTH checks (`relay.policy`) both use
it, so policy may depend on tenants without tenants reaching back up into policy. The
rule itself lives in `engram.urls` (NIP-62 and NIP-98 compare hosts the same way).
"""

from __future__ import annotations

from engram.urls import host_of as host_of

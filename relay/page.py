"""The HTML page a browser gets at a relay's URL (no NIP-11 Accept header).

Pure: a tenant and numbers in, a small self-contained HTML document out. No scripts, no
external resources; every value is escaped.
"""

from __future__ import annotations

from html import escape

import msgspec

from relay.nip11 import SUPPORTED_NIPS
from relay.tenants import Tenant

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:44rem;margin:2rem auto;padding:0 1rem;"
    "color:#222}code{background:#f2f2f2;padding:.1rem .3rem;border-radius:3px}"
    "table{border-collapse:collapse}td,th{text-align:left;padding:.15rem .8rem .15rem 0}"
    "th{font-weight:normal;color:#555}h2{font-size:1.05rem;margin-top:1.6rem}"
)


def _rows(items: list[tuple[str, object]]) -> str:
    return "\n".join(
        f"<tr><th>{escape(str(k))}</th><td>{escape(_show(v))}</td></tr>" for k, v in items
    )


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _connect(urls: list[str], configured: bool) -> str:
    """Where to connect: the tenant's URLs (relay.identity), never the Host header's."""
    first, others = urls[0], urls[1:]
    text = f"<p>A Nostr relay. Connect a Nostr client to <code>{escape(first)}</code>"
    if others:
        text += " (also " + ", ".join(f"<code>{escape(u)}</code>" for u in others) + ")"
    text += "</p>"
    if not configured:
        text += (
            "<p>No public URL is configured: NIP-42 AUTH is accepted only for the URLs above."
            " The operator sets the URL clients use with <code>--public-url</code>.</p>"
        )
    return text


def render(
    tenant: Tenant, urls: list[str], configured: bool, version: str, counters: dict[str, int]
) -> str:
    """The page for one tenant: `urls` are the ones it is known by (first shown first),
    `configured` whether they come from a public URL setting."""
    name = escape(tenant.name)
    nips = ", ".join(
        f'<a href="https://github.com/nostr-protocol/nips/blob/master/{n:02d}.md">{n:02d}</a>'
        for n in SUPPORTED_NIPS
    )
    limits = list(msgspec.to_builtins(tenant.limits).items())
    about: list[tuple[str, object]] = [("software", f"engram-relay {version}")]
    if tenant.pubkey:
        about.append(("operator pubkey", tenant.pubkey))
    if tenant.contact:
        about.append(("contact", tenant.contact))
    about.append(("writes", "members only" if tenant.members_only else "open"))
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{name}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{name}</h1>
<p>{escape(tenant.description)}</p>
{_connect(urls, configured)}
<h2>Relay</h2>
<table>
{_rows(about)}
<tr><th>supported NIPs</th><td>{nips}</td></tr>
</table>
<h2>Live</h2>
<table>
{_rows(list(counters.items()))}
</table>
<h2>Limits</h2>
<table>
{_rows(limits)}
</table>
</body>
</html>
"""

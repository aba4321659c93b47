"""Where engram-relay keeps its files on this machine: one home for the user's data
directory (`~/.local/share/engram-relay` on Linux, by platformdirs). `engram serve`'s
embedded PostgreSQL, the recall cache and the review page's visit mark all live under it.

A leaf module (platformdirs only), so the client layer (`cli.nostr.files`) may import it
without loading the relay."""

from __future__ import annotations

import warnings
from pathlib import Path

APP_NAME = "engram-relay"


def data_dir() -> Path:
    """The user's data directory for engram-relay; not created here."""
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root, containers)
        warnings.simplefilter("ignore")
        import platformdirs

        return Path(platformdirs.user_data_dir(APP_NAME))

"""Files the CLI writes that hold private data (events, keys): the owner's only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from relay.dirs import data_dir as user_data_dir


def data_dir(sub: str) -> Path:
    """`sub` under the user's data directory (`relay.dirs`, shared with `engram serve`'s
    embedded PostgreSQL): `~/.local/share/engram-relay/SUB` on Linux; not created here."""
    return user_data_dir() / sub


def open_private(path: str | os.PathLike[str]) -> IO[bytes]:
    """`path` opened for writing (truncated) with mode 0600, also when it existed with a
    wider mode (the mode given to open() applies only to a file it creates)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise

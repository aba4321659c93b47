"""Files the CLI writes that hold private data (events, keys): the owner's only."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import IO

APP_NAME = "engram-relay"  # the data directory `engram serve`'s embedded PostgreSQL uses too


def data_dir(sub: str) -> Path:
    """`sub` under the user's data directory (`~/.local/share/engram-relay/SUB` on Linux);
    not created here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import platformdirs

        return Path(platformdirs.user_data_dir(APP_NAME)) / sub


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

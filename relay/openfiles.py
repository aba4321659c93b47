"""The process's open-files limit, raised at start-up to what the system allows.

Every websocket connection holds a file descriptor. Distributions start services with a
soft limit of 1,024 while allowing far more (the hard limit): a relay left at the soft
limit refuses its 1,000th client with EMFILE (and uvicorn logs an error per refused
accept). Raising the soft limit to the hard one needs no privilege; the hard limit is
the operator's (`ulimit -n`, systemd's LimitNOFILE, a container's `--ulimit nofile`:
docs/OPERATING.md "Large crowds").
"""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

NR_OPEN = Path("/proc/sys/fs/nr_open")  # the kernel's cap when the hard limit is unlimited
FALLBACK_CAP = 1_048_576


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(NR_OPEN.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return FALLBACK_CAP


def raise_open_files() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit: (soft before, soft now). The
    limit stays as it was if the system refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]

"""One root for every temporary folder opfuse leaves behind, pruned as it grows.

Reproducers of internal errors (the pipeline's, the CPU and NVPTX lowerings'), libraries
extracted from bundles and ptxas work folders all go under :func:`root`
(``$OPFUSE_TEMP_DIR``, default ``<system temp>/opfuse-<user>``) instead of loose in the
system temp directory (134 were left there after one test run). Each new folder prunes the
root to the :data:`KEEP` newest entries; an entry younger than :data:`MIN_AGE_S` is never
removed (another process may be using it).

With ``$OPFUSE_DUMP_DIR`` set, reproducers go there instead, and are never pruned: the user
asked for them.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import tempfile
import time
from pathlib import Path

from . import config

#: Entries kept under the root when a new folder is made.
KEEP = 32
#: Entries younger than this (seconds) are never pruned.
MIN_AGE_S = 120.0


def root() -> Path:
    """The temp root (created)."""
    chosen = config.TEMP_DIR.path()
    if chosen is None:
        try:
            user = getpass.getuser()
        except Exception:  # noqa: BLE001  (no user name in some containers)
            user = str(os.getuid()) if hasattr(os, "getuid") else "user"
        chosen = Path(tempfile.gettempdir()) / f"opfuse-{user}"
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen


def new_folder(kind: str, *, reproducer: bool = False) -> Path:
    """A fresh folder ``<kind>-XXXX`` under the root (under ``$OPFUSE_DUMP_DIR`` for a
    reproducer when that is set); older entries of the root are pruned first."""
    if reproducer:
        dump = config.DUMP_DIR.path()
        if dump is not None:
            with contextlib.suppress(OSError):
                dump.mkdir(parents=True, exist_ok=True)
                return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=dump))
    base = root()
    prune(base)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=base))


def prune(base: Path, keep: int = KEEP, min_age_s: float = MIN_AGE_S) -> int:
    """Remove all but the ``keep`` newest entries of ``base`` that are older than
    ``min_age_s``; returns how many were removed (errors are ignored: another process may
    be pruning too)."""
    now = time.time()
    entries = []
    with contextlib.suppress(OSError):
        for p in base.iterdir():
            with contextlib.suppress(OSError):
                entries.append((p.stat().st_mtime, p))
    entries.sort(reverse=True)
    removed = 0
    for mtime, p in entries[keep:]:
        if now - mtime < min_age_s:
            continue
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed += 1
    return removed

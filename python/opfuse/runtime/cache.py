"""The on-disk kernel cache: compiled kernels keyed by what determines them.

A key is the SHA-256 of its parts: the kernel's IR text, the target chip, the pipeline
and options, and the toolchain versions (MLIR wheels, ptxas). An entry is one JSON file
(``<dir>/<key[:2]>/<key>.json``) holding the artifacts and a checksum of them; it is
written to a temporary file in the same directory and renamed over the final name
(``os.replace``), so readers never see half an entry and concurrent writers of the same
key both leave a complete one. An entry that does not parse, has the wrong key or a bad
checksum is treated as absent (and rewritten by the caller): never trusted.

The directory is ``$OPFUSE_CACHE_DIR`` (default ``~/.cache/opfuse``); caching is skipped
silently when it cannot be created or written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..config import CACHE_DIR

FORMAT = 1


def make_key(*parts: Any) -> str:
    """A stable key from strings, numbers, and JSON-able values."""
    h = hashlib.sha256()
    for p in parts:
        text = p if isinstance(p, str) else json.dumps(p, sort_keys=True, default=str)
        h.update(len(text).to_bytes(8, "little"))
        h.update(text.encode())
    return h.hexdigest()


def _checksum(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class KernelCache:
    """Get/put JSON-able artifacts by key (bytes values are stored base64-encoded).

    Args:
        directory: the cache folder; default ``$OPFUSE_CACHE_DIR``. ``None`` and an
            unusable folder disable the cache.
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, enabled: bool = True):
        root = Path(directory).expanduser() if directory is not None else CACHE_DIR.path()
        self.dir = root / "kernels" if root is not None else None
        self.enabled = enabled and self.dir is not None
        self.hits = self.misses = self.corrupt = 0

    def _path(self, key: str) -> Path:
        assert self.dir is not None
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if not self.enabled:
            return None
        path = self._path(key)
        try:
            raw = path.read_text()
        except OSError:
            self.misses += 1
            return None
        try:
            entry = json.loads(raw)
            ok = (
                entry.get("format") == FORMAT
                and entry.get("key") == key
                and entry.get("checksum") == _checksum(entry["payload"])
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            self.corrupt += 1
            self.misses += 1
            return None
        self.hits += 1
        return _decode(entry["payload"])

    def put(self, key: str, value: dict) -> None:
        if not self.enabled:
            return
        payload = _encode(value)
        entry = {"format": FORMAT, "key": key, "checksum": _checksum(payload), "payload": payload}
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}-", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(entry, f)
                os.replace(tmp, path)
            except BaseException:
                with _suppress():
                    os.unlink(tmp)
                raise
        except OSError:
            return  # a read-only or full disk only costs recompilation


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


def _encode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value

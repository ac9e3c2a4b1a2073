"""One digest of data dicts and settings, for caches keyed by what a result depends on."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np


def digest(*parts) -> str:
    """SHA-256 of ``parts``: a Mapping by its sorted keys and each value's dtype, shape and bytes
    (object arrays by repr); anything else by repr. Equal inputs, equal digests."""
    hasher = hashlib.sha256()
    for part in parts:
        if isinstance(part, Mapping):
            for key in sorted(part):
                value = np.asarray(part[key])
                hasher.update(f"{key}:{value.dtype}:{value.shape};".encode())
                hasher.update(np.ascontiguousarray(value).tobytes() if value.dtype != object else repr(value).encode())
        else:
            hasher.update(repr(part).encode())
    return hasher.hexdigest()

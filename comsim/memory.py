"""Keep freed memory in the process: large CPU tensors without a page fault per use.

glibc hands every allocation above its mmap threshold (at most 32 MiB) to a fresh ``mmap`` and returns it to
the system when freed, so a training step that makes and drops the same large activations (a full-resolution
conv head over 64 frames of 128x128 is ~70 MB a tensor) page-faults all of them in again at every step: a
fifth of the translator's CPU time went to the kernel. With mmap off and the heap never trimmed, freed blocks
are reused. Speed only: the numbers computed are the same.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_MAX = -4
_done = False


def keep_freed_memory() -> bool:
    """Tell glibc to serve large blocks from the heap and keep what is freed; True if it took (Linux glibc
    only; elsewhere a no-op returning False). Once per process."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to set
        return False
    _done = ok
    return ok

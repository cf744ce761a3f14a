"""Keep freed heap memory mapped between steps of a multi-worker job (glibc's malloc thresholds).

A multi-worker step allocates and frees tens of MB of short-lived buffers (the chunks each
collective sends and receives, rows, activations, gradients). glibc's malloc serves a buffer above
its mmap threshold from a fresh mapping and returns the top of a heap to the system once more than
its trim threshold lies free there; it moves both thresholds itself, and where they settle depends
on the order of a run's allocations. In runs where they settled low, every step touched fresh
pages again (thousands of page faults per step, the kernel zeroing each page) and a 2-worker step
took 1.5 times as long (docs/multi_worker.md#freed-memory has the measurements). One worker alone
is not affected, so this is part of joining a multi-worker job, which is why it lives here.

When an embedding joins a multi-worker job (ReplicaGroup.create_variables) the process fixes, once:
- M_MMAP_THRESHOLD = 32 MiB, the largest value glibc accepts on 64-bit systems (a step's buffers
  at batch 4096 are at most about 14 MB; larger ones still get their own mapping);
- M_TRIM_THRESHOLD = 128 MiB: free memory up to that much at the top of a heap stays in the
  process between steps.

Nothing is changed when the user chose: TF_SC_EMBEDDING_KEEP_FREED_MEMORY=0 (the library's
switch), MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, or glibc.malloc.mmap_threshold /
glibc.malloc.trim_threshold in GLIBC_TUNABLES (glibc reads those at start-up). Nor when malloc is
not glibc's: another C library, or an allocator such as tcmalloc or jemalloc preloaded in its place.
"""
import ctypes
import ctypes.util
import os

from absl import logging

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 128 << 20
SWITCH = "TF_SC_EMBEDDING_KEEP_FREED_MEMORY"
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
# mallopt's parameter numbers (glibc's malloc.h).
_PARAMETERS = {"M_MMAP_THRESHOLD": -3, "M_TRIM_THRESHOLD": -1}
_VALUES = {"M_MMAP_THRESHOLD": MMAP_THRESHOLD_BYTES, "M_TRIM_THRESHOLD": TRIM_THRESHOLD_BYTES}
_applied = []   # what keep_freed_memory set in this process, once


def glibc_malloc():
    """glibc, when the process's malloc is glibc's; None under another C library or when another
    allocator replaces malloc (its mallopt would then tune a malloc nobody calls)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    called = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    return libc if called == ctypes.cast(libc.malloc, ctypes.c_void_p).value else None


def user_choices(environ):
    """What in `environ` decides malloc's thresholds instead of the library (names; [] if none)."""
    tunables = [t.split("=", 1)[0] for t in environ.get("GLIBC_TUNABLES", "").split(":")]
    return ([SWITCH] * (environ.get(SWITCH, "1") == "0") +
            [name for name in USER_VARIABLES if name in environ] +
            [name for name in USER_TUNABLES if name in tunables])


def planned(environ, libc):
    """{mallopt parameter name: bytes} the library sets given `environ` and `libc` (glibc_malloc()),
    {} when the user or the allocator decides."""
    return {} if user_choices(environ) or libc is None else dict(_VALUES)


def set_thresholds(environ, libc):
    """Sets what `planned` says through libc.mallopt; returns the settings that took."""
    plan = planned(environ, libc)
    if not plan:
        logging.info("malloc thresholds left alone: %s",
                     ", ".join(user_choices(environ)) or "malloc is not glibc's")
    settings = {}
    for name, value in plan.items():
        if libc.mallopt(ctypes.c_int(_PARAMETERS[name]), ctypes.c_int(value)) == 1:
            settings[name] = value
        else:
            logging.warning("mallopt(%s, %d) failed; freed memory may go back to the system after "
                            "every step", name, value)
    if settings:
        logging.info("malloc thresholds for the multi-worker step: %s", settings)
    return settings


def keep_freed_memory():
    """set_thresholds for this process, once (later calls return the first result)."""
    if not _applied:
        _applied.append(set_thresholds(os.environ, glibc_malloc()))
    return dict(_applied[0])


def applied():
    """What keep_freed_memory set in this process ({} if it set nothing), or None before it ran."""
    return dict(_applied[0]) if _applied else None

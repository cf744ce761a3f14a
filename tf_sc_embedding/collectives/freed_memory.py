"""Keep freed heap memory mapped between steps of a multi-worker job (glibc's malloc settings).

A multi-worker step allocates tens of MB of short-lived buffers (send and receive chunks, rows,
activations, gradients) and frees them again. glibc's malloc serves a buffer above its mmap
threshold from a fresh mapping and returns the top of a heap to the system once more than its trim
threshold lies free there; the next step then touches new pages, and every first touch is a page
fault that the kernel zeroes. glibc raises both thresholds by itself after it frees a mapped
buffer, but the values it reaches depend on the order of the allocations: a 2-worker step at
batch 4096 settled either near 23 ms or near 35-45 ms, with 2,000-5,000 faults and 7-17 ms of system
CPU per step in the slow runs (one worker: about 30 faults; BENCHMARKS.md#weak-scaling). With the
thresholds fixed as below, both clusters became one (about 150 faults, 2 ms of system CPU), on both
transports.

So when an embedding joins a multi-worker job (ReplicaGroup.create_variables), it fixes:
- M_MMAP_THRESHOLD = 32 MiB, the largest value glibc accepts on 64-bit systems (a step's buffers
  at batch 4096 are at most about 14 MB; larger ones still get their own mapping);
- M_TRIM_THRESHOLD = 128 MiB: free memory up to that much at the top of a heap stays in the
  process instead of going back to the system after every step.

A process keeps up to that much freed memory per heap arena. The user overrides both by starting the
process with MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in its environment, or with
glibc.malloc.mmap_threshold or glibc.malloc.trim_threshold in GLIBC_TUNABLES (glibc reads them at
start-up; the library then changes nothing). Other C libraries are left alone.
"""
import ctypes
import ctypes.util
import os

from absl import logging

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 128 << 20
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_applied = []   # the settings this process applied, once


def _glibc():
    """glibc, or None under another C library."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def user_overrides(environ):
    """The variables or tunables of `environ` that set either threshold (the user's choice)."""
    tunables = [t.split("=", 1)[0] for t in environ.get("GLIBC_TUNABLES", "").split(":")]
    return ([name for name in USER_VARIABLES if name in environ] +
            [name for name in USER_TUNABLES if name in tunables])


def apply(environ, libc):
    """Sets the thresholds through `libc` unless `environ` sets one (user_overrides) or `libc` is
    None (not glibc). Returns {"M_MMAP_THRESHOLD": bytes, "M_TRIM_THRESHOLD": bytes} for the
    ones set, {} when the user's environment or the C library decides."""
    user = user_overrides(environ)
    if user:
        logging.info("malloc thresholds left as the environment sets them (%s)", ", ".join(user))
        return {}
    if libc is None:
        logging.info("malloc thresholds left alone: the C library is not glibc")
        return {}
    settings = {}
    for name, parameter, value in (("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                                   ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            settings[name] = value
        else:
            logging.warning("mallopt(%s, %d) failed; freed memory may go back to the system after "
                            "every step", name, value)
    logging.info("malloc thresholds for the multi-worker step: %s", settings)
    return settings


def keep_freed_memory():
    """`apply` for this process, once (later calls return the first result)."""
    if not _applied:
        user = user_overrides(os.environ)
        _applied.append(apply(os.environ, None if user else _glibc()))
    return dict(_applied[0])


def applied():
    """What keep_freed_memory set in this process ({} if it set nothing), or None before it ran."""
    return dict(_applied[0]) if _applied else None

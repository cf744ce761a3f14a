"""The shared-memory regions oneCCL's one-host path leaves behind, and their cleanup.

Between workers of one host, oneCCL moves bytes through libfabric's shm provider, which gives
every process one region in /dev/shm named "<pid>:<endpoint>:<n>" (64 MiB, a few tens of MiB of
it touched; /dev/shm is tmpfs, so that is memory). libfabric removes a region's name only when
the process closes its communicator, which a worker never does (communicators live until the
process exits, cc/transport/oneccl_communicator.cc), nor does a killed worker. So regions of
dead processes pile up: 789 of them held 19 GB of the 24 GB development machine after a day of
test runs. With them there, a loop that only forms two-rank communicators crashed inside libfabric
in 4 of about 120 formations (SIGSEGV in smr_map_to_endpoint; CI once saw a worker die of SIGSEGV
at that point); with them removed, in none of 300. Planting copies of a region under the ids the next
processes got did not bring the crash back, so which stale region triggered it is not known.

So before a worker forms a communicator it removes the regions of this host's dead processes that
its user owns (`remove_stale_regions`), and at exit it removes its own names
(`remove_own_regions`; peers that mapped a region keep their mapping). A killed worker's region
stays until the next job on the host starts.
"""
import atexit
import os
import re

DIRECTORY = "/dev/shm"
_REGION = re.compile(r"(\d+):\d+:\d+")


def _region_pid(name):
    match = _REGION.fullmatch(name)
    return int(match.group(1)) if match else None


def _is_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def _remove(path):
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:   # another worker of the host removed it first
        return False


def stale_regions(directory=DIRECTORY):
    """The names of the regions whose process no longer exists and that this user owns."""
    try:
        names = os.listdir(directory)
    except OSError:   # no /dev/shm: nothing libfabric could have left
        return []
    stale = []
    for name in names:
        pid = _region_pid(name)
        if pid is None or pid == os.getpid() or _is_alive(pid):
            continue
        try:
            if os.stat(os.path.join(directory, name)).st_uid == os.getuid():
                stale.append(name)
        except FileNotFoundError:
            continue
    return stale


def remove_stale_regions(directory=DIRECTORY):
    """Removes stale_regions(); returns the names removed."""
    return [name for name in stale_regions(directory)
            if _remove(os.path.join(directory, name))]


def remove_own_regions(directory=DIRECTORY, pid=None):
    """Removes the names of this process's regions (the mappings stay valid); returns them."""
    pid = os.getpid() if pid is None else pid
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if _region_pid(name) == pid and _remove(os.path.join(directory, name)):
            removed.append(name)
    return removed


_cleanup_registered = False


def clean_up_around_this_worker():
    """Before forming a communicator: removes dead processes' regions now and this process's
    own regions at exit (registered once)."""
    global _cleanup_registered
    remove_stale_regions()
    if not _cleanup_registered:
        atexit.register(remove_own_regions)
        _cleanup_registered = True

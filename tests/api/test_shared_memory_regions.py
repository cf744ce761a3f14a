"""The cleanup of libfabric's shared-memory regions (collectives/shared_memory.py), on a folder
standing in for /dev/shm: only regions of dead processes go, and a process removes its own."""
import os
import subprocess
import sys

from tf_sc_embedding.collectives import shared_memory


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def touch(directory, name):
    (directory / name).write_bytes(b"\0" * 16)


def test_only_the_regions_of_dead_processes_are_removed(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    names = [f"{dead}:0:0", f"{dead}:1:0", f"{alive}:0:0", f"{os.getpid()}:0:0",
             f"{dead}:0", f"x{dead}:0:0", "fi_shm_other", f"{dead}:0:0.tmp"]
    for name in names:
        touch(tmp_path, name)
    removed = shared_memory.remove_stale_regions(str(tmp_path))
    assert sorted(removed) == sorted([f"{dead}:0:0", f"{dead}:1:0"])
    assert sorted(os.listdir(tmp_path)) == sorted(names[2:])


def test_a_process_removes_its_own_regions_and_nothing_else(tmp_path):
    names = [f"{os.getpid()}:0:0", f"{os.getpid()}:2:1", f"{os.getpid() + 1}:0:0",
             f"1{os.getpid()}:0:0"]
    for name in names:
        touch(tmp_path, name)
    removed = shared_memory.remove_own_regions(str(tmp_path))
    assert sorted(removed) == sorted(names[:2])
    assert sorted(os.listdir(tmp_path)) == sorted(names[2:])


def test_a_missing_folder_removes_nothing(tmp_path):
    assert shared_memory.remove_stale_regions(str(tmp_path / "none")) == []
    assert shared_memory.remove_own_regions(str(tmp_path / "none")) == []

"""malloc's thresholds for multi-worker steps (collectives/freed_memory.py): what is set, when the
user's environment wins, and that the settings really keep a step's freed buffers mapped."""
import os
import subprocess
import sys
import textwrap

import pytest

from tf_sc_embedding.collectives import freed_memory


class RecordingLibc:
    def __init__(self, result=1):
        self.calls, self.result = [], result

    def mallopt(self, parameter, value):
        self.calls.append((parameter.value, value.value))
        return self.result


def test_sets_both_thresholds_through_mallopt():
    libc = RecordingLibc()
    settings = freed_memory.set_thresholds({}, libc)
    assert sorted(libc.calls) == [(-3, 32 << 20), (-1, 128 << 20)]   # M_MMAP_, M_TRIM_THRESHOLD
    assert settings == {"M_MMAP_THRESHOLD": 32 << 20, "M_TRIM_THRESHOLD": 128 << 20}
    assert settings == freed_memory.planned({}, libc)


def test_the_switch_a_user_variable_or_tunable_leaves_malloc_alone():
    users = [{freed_memory.SWITCH: "0"}]
    users += [{name: "65536"} for name in freed_memory.USER_VARIABLES]
    users += [{"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{name}=65536"}
              for name in freed_memory.USER_TUNABLES]
    for environ in users:
        libc = RecordingLibc()
        assert freed_memory.set_thresholds(environ, libc) == {}, environ
        assert freed_memory.planned(environ, libc) == {}
        assert libc.calls == []
    # Other tunables are not about the thresholds, and the switch at 1 is the default.
    for environ in ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, {freed_memory.SWITCH: "1"}):
        libc = RecordingLibc()
        assert freed_memory.set_thresholds(environ, libc)
        assert len(libc.calls) == 2


def test_other_allocators_and_refused_settings_are_reported_as_unset():
    assert freed_memory.set_thresholds({}, None) == {} == freed_memory.planned({}, None)
    libc = RecordingLibc(result=0)
    assert freed_memory.set_thresholds({}, libc) == {}
    assert len(libc.calls) == 2


def test_this_process_runs_glibc_malloc():
    if not os.confstr("CS_GNU_LIBC_VERSION") or "LD_PRELOAD" in os.environ:
        pytest.skip("not plain glibc: glibc_malloc() may rightly be None")
    assert freed_memory.glibc_malloc() is not None


# Three 12 MB buffers touched and freed per "step": glibc's own thresholds (raised to 12 MB mmap,
# 24 MB trim after the first free) hand the 36 MB at the heap's top back every step. Transparent
# huge pages are off for the process, so that a fault is one 4 KiB page whatever the host's setting.
_STEPS = textwrap.dedent("""
    import ctypes, importlib.util, resource, sys
    spec = importlib.util.spec_from_file_location("freed_memory", sys.argv[1])
    freed_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(freed_memory)
    libc = ctypes.CDLL("libc.so.6")
    libc.prctl(41, 1, 0, 0, 0)   # PR_SET_THP_DISABLE
    if sys.argv[2] == "keep":
        print(freed_memory.set_thresholds({}, freed_memory.glibc_malloc()))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def step():
        buffers = [libc.malloc(12 << 20) for _ in range(3)]
        for b in buffers:
            ctypes.memset(b, 1, 12 << 20)
        for b in reversed(buffers):
            libc.free(b)
    step(); step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
""")


def _faults_per_step(mode):
    env = {k: v for k, v in os.environ.items()
           if not freed_memory.user_choices({k: v})}
    out = subprocess.run([sys.executable, "-c", _STEPS, freed_memory.__file__, mode], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.split("\n")
    return float(out[-2])


def test_kept_thresholds_stop_the_page_faults_of_freed_buffers():
    if freed_memory.glibc_malloc() is None:
        pytest.skip("malloc is not glibc's: nothing is set (the unit tests above cover that)")
    plain, kept = _faults_per_step("plain"), _faults_per_step("keep")
    assert plain > 2000   # 36 MB of fresh pages per step without the settings
    assert kept < 100

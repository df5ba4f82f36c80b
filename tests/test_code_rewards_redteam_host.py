"""Red team, round four: what reaches past the namespaces (sockets, the host's files, kernel
memory) and the trainer's own resources. Each test names the attack and the verdict, and checks
the host after the call: no process of the program left, no lock on the host's file, its page
cache and the host's shared memory unchanged.

Run with tests/test_code_rewards_redteam.py (``make test-redteam``), as the trainer's user (root
in CI) and once more as an ordinary user (that file's last test).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import secrets
import socket
import struct
import threading
import time
import tracemalloc

import pytest

from maxent_grpo.rewards import cgroup, get_reward_funcs, sandbox, unit_tests
from maxent_grpo.rewards.sandbox import Limits, run_python
from test_code_rewards_redteam import _named, _shmem_kib, fenced

pytestmark = [
    pytest.mark.redteam,
    pytest.mark.skipif(
        os.environ.get("MAXENT_GRPO_REDTEAM_TESTS") != "1",
        reason="red-team suite: make test-redteam",
    ),
]

#: A host file the sandbox sees through its read-only binds (the standard library's os.py).
HOST_FILE = os.path.realpath(os.__file__)
LIBC = ctypes.CDLL(None, use_errno=True)


def _watched(source: str, limits: Limits, **kwargs):
    """Run a program that names itself (a fresh token) while the host is watched: (result,
    peak rise of the host's shared memory in KiB). After the call no process of it is left and
    the shared memory is back; ``kwargs["during"]``, if given, is called once it runs."""
    during = kwargs.pop("during", None)
    token = "mx" + secrets.token_hex(6)
    program = f"open('/proc/self/comm', 'w').write({token!r})\n" + source
    before, done, peak, seen = _shmem_kib(), [], 0, []
    runner = threading.Thread(
        target=lambda: done.append(run_python(program, limits=limits, **kwargs))
    )
    runner.start()
    try:
        while runner.is_alive():
            peak = max(peak, _shmem_kib() - before)
            if _named(token) and during is not None and not seen:
                seen.append(during())
            time.sleep(0.02)
    finally:
        runner.join()
    assert _named(token) == [], "a process of the program outlived the call"
    assert _shmem_kib() - before < 8 << 10, "shared memory still held after the call"
    assert during is None or seen, "the program was never seen running"
    return done[0], peak, (seen or [None])[0]


HOLD = "import sys, time\nsys.stdout.flush()\ntime.sleep(60)\n"

# ---- sockets past the network namespace -------------------------------------------------


SOCKET_PROBE = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, family, kind in FAMILIES:
    fd = libc.socket(family, kind, 0)
    out[name] = 'ok' if fd >= 0 else ctypes.get_errno()
    pair = (ctypes.c_int * 2)()
    paired = libc.socketpair(family, kind, 0, pair) == 0
    out[name + ' pair'] = 'ok' if paired else ctypes.get_errno()
print(json.dumps(out), flush=True)
"""
FAMILIES = [  # (name, family, type): SOCK_STREAM 1, SOCK_DGRAM 2, SOCK_RAW 3, SOCK_SEQPACKET 5
    ("unix", 1, 1), ("vsock", 40, 1), ("packet", 17, 3), ("netlink", 16, 3), ("inet", 2, 1),
    ("inet6", 10, 2), ("alg", 38, 5), ("bluetooth", 31, 1), ("can", 29, 3), ("tipc", 30, 2),
    ("rds", 21, 5), ("key", 15, 3), ("xdp", 44, 3), ("qipcrtr", 42, 2), ("llc", 26, 2),
]  # fmt: skip


def test_sockets_are_unix_only_no_vsock_or_other_family():
    """Attack: open a socket (and a socket pair) of every family that reaches past the network
    namespace or into kernel state: vsock (its port space is the machine's: a bind of the
    host's port failed with EADDRINUSE), packet, netlink, inet, alg, bluetooth, ... while the
    host holds a vsock port. Verdict: each refused (EPERM); AF_UNIX works (and stays in the
    namespace)."""
    holder = None
    try:
        holder = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        holder.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
    except (OSError, AttributeError):
        holder = None  # no vsock on this host: the refusal is still checked
    try:
        result = run_python(SOCKET_PROBE.replace("FAMILIES", repr(FAMILIES)), "", Limits())
    finally:
        if holder is not None:
            holder.close()
    seen = json.loads(result.stdout)
    assert seen.pop("unix") == "ok" and seen.pop("unix pair") == "ok", seen
    assert set(seen.values()) == {1}, seen  # EPERM for every other family, socket and pair


# ---- the host's files through the read-only binds -----------------------------------------

HOST_FILE_PROBE = """
import ctypes, fcntl, mmap, os, struct
libc = ctypes.CDLL(None, use_errno=True)
f = os.open(TARGET, os.O_RDONLY)
out = {}
def tried(name, call):
    try:
        value = call()
        out[name] = 'ok' if value is None or value >= 0 else ctypes.get_errno()
    except OSError as err:
        out[name] = err.errno
lock = struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0)
tried('fanotify_init', lambda: libc.syscall(300, 0, 0))
tried('flock', lambda: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB))
tried('F_SETLK', lambda: fcntl.fcntl(f, fcntl.F_SETLK, lock) and None)
tried('F_OFD_SETLK', lambda: fcntl.fcntl(f, fcntl.F_OFD_SETLK, lock) and None)
tried('F_GETLK', lambda: fcntl.fcntl(f, fcntl.F_GETLK, lock) and None)
tried('F_SETLEASE', lambda: fcntl.fcntl(f, fcntl.F_SETLEASE, fcntl.F_RDLCK))
tried('F_NOTIFY', lambda: fcntl.fcntl(os.open('/usr', os.O_RDONLY), fcntl.F_NOTIFY, 0x80000001))
tried('fadvise DONTNEED', lambda: os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED))
tried('readahead', lambda: libc.syscall(187, f, 0, 1 << 20))
size = os.fstat(f).st_size
buffers = ctypes.create_string_buffer(16), ctypes.create_string_buffer(64)
tried('cachestat', lambda: libc.syscall(451, f, *buffers, 0))
view = mmap.mmap(f, size, prot=mmap.PROT_READ)
tried('madvise PAGEOUT', lambda: view.madvise(21))
tried('madvise COLD', lambda: view.madvise(20))
address = ctypes.c_void_p(libc.mmap(None, size, 1, 1, f, 0))
tried('mincore', lambda: libc.mincore(address, size, ctypes.create_string_buffer(size // 4096 + 1)))
tried('setxattr', lambda: os.setxattr('.', 'user.x', b'1'))
tried('sync', lambda: libc.sync())
tried('syncfs', lambda: libc.syncfs(f))
print(out, flush=True)
"""


def _host_mincore(path: str) -> bytes:
    """Which pages of path are in the host's page cache (mincore's vector)."""
    LIBC.mmap.restype = ctypes.c_void_p
    LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    LIBC.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = LIBC.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        vector = ctypes.create_string_buffer(size // 4096 + 1)
        assert LIBC.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0
        LIBC.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))
        return bytes(b & 1 for b in vector.raw)
    finally:
        os.close(fd)


def _host_can_lock(path: str) -> bool:
    """The host takes an exclusive flock and finds no POSIX lock on path (read-only open)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)
        return struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, probe))[0] == fcntl.F_UNLCK
    finally:
        os.close(fd)


def test_the_host_files_cannot_be_watched_locked_or_evicted():
    """Attack: on a file of the Python installation (read-only bind): a fanotify mark (reports
    the trainer's opens and reads), flock and POSIX/OFD locks and a lease (the host's own lock
    or open fails or waits), dnotify, posix_fadvise(DONTNEED) and madvise(PAGEOUT/COLD)
    (evict the host's page cache), readahead, mincore and cachestat (what the host reads),
    an xattr, sync and syncfs; then hold the file open and sleep. Verdict: each refused
    (EPERM); while it sleeps the host locks the file and sees no lock; its pages stay cached;
    nothing is left after the call."""
    with open(HOST_FILE, "rb") as cached:
        cached.read()  # every page in the host's page cache
    resident = _host_mincore(HOST_FILE)
    source = HOST_FILE_PROBE.replace("TARGET", repr(HOST_FILE)) + HOLD
    result, _, host_locked = _watched(
        source, Limits(wall_seconds=1.5), during=lambda: _host_can_lock(HOST_FILE)
    )
    seen = eval(result.stdout)  # noqa: S307 - the probe's own dict of errnos
    assert set(seen.values()) == {1}, seen  # EPERM for each
    assert host_locked, "the host could not lock the file while the program held it"
    assert _host_mincore(HOST_FILE) == resident, "the host's page cache of the file changed"


# ---- kernel memory no rlimit counts ---------------------------------------------------------

SEALED_PROBE = """
import json, os
out = {}
argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')
fds = {'stdin': 0, **({'control': int(argv[-3])} if b'runner.py' in b' '.join(argv) else {})}
for name, fd in fds.items():
    for how, call in (
        ('write', lambda: os.pwrite(fd, b'x' * 4096, 0)),
        ('grow', lambda: os.ftruncate(fd, 8 << 20)),
        ('fallocate', lambda: os.posix_fallocate(fd, 0, 8 << 20)),
        ('reopened', lambda: os.ftruncate(os.open(f'/proc/self/fd/{fd}', os.O_RDWR), 8 << 20)),
    ):
        try:
            call()
            out[name + ' ' + how] = 'ok'
        except OSError as err:
            out[name + ' ' + how] = err.errno
print(json.dumps(out), flush=True)
"""


def test_stdin_and_control_memory_files_are_sealed():
    """Attack: grow the stdin memory file (and the unit-test runner's control file), which
    RLIMIT_AS does not count, to 8 MiB each (RLIMIT_FSIZE's 16 MiB was the only bound before):
    write, ftruncate, fallocate, and the same through a new read-write open of /proc/self/fd/N.
    Verdict: each refused (EPERM, the files are sealed; the reopen itself may be refused), the
    host's shared memory unchanged during and after."""
    for runner in (None, unit_tests.RUNNER):
        extra = {"runner": runner, "control": b"{}"} if runner else {}
        source = SEALED_PROBE + ("import os\nos._exit(0)\n" if runner else "")
        result, peak, _ = _watched(source, Limits(memory_mb=64), stdin="x" * 100, **extra)
        seen = json.loads(result.stdout)
        assert len(seen) == (8 if runner else 4) and set(seen.values()) <= {1, 13}, seen
        assert peak < 8 << 10, f"the host's shared memory rose {peak} KiB during the run"


PARK_PIPES = """
import array, fcntl, os, socket
a, b = socket.socketpair()
parked = held = 0
try:
    fcntl.fcntl(os.pipe()[1], fcntl.F_SETPIPE_SZ, 1 << 20)
    grown = 'ok'
except OSError as err:
    grown = err.errno
try:
    while True:
        batch = []
        for _ in range(20):
            r, w = os.pipe()
            os.set_blocking(w, False)
            try:
                while True:
                    held += os.write(w, b'x' * 65536)
            except BlockingIOError:
                pass
            batch += [r, w]
        a.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', batch))])
        for fd in batch:
            os.close(fd)
        parked += len(batch) // 2
except OSError as err:
    print(grown, parked, held >> 20, err.errno, flush=True)
"""


def test_pipes_parked_in_flight_stay_small():
    """Attack: grow pipes to 1 MiB (F_SETPIPE_SZ), fill them, park them in flight over a
    socket (SCM_RIGHTS: not open files) and open more, holding kernel memory RLIMIT_AS does
    not count (80 MiB with a 64 MiB limit before). Verdict: F_SETPIPE_SZ refused, so each pipe
    holds 64 KiB; the kernel refuses more than the open-file limit in flight (ETOOMANYREFS):
    at most a few MiB, nothing left after the call."""
    result, _, _ = _watched(PARK_PIPES + HOLD, Limits(wall_seconds=1.5, memory_mb=64))
    grown, parked, held_mib, errno = map(int, result.stdout.split())
    assert grown == 1 and errno in (24, 109), result.stdout  # EMFILE or ETOOMANYREFS
    assert parked <= 2 * Limits().open_files and held_mib <= 8, result.stdout


# ---- the trainer's own resources ------------------------------------------------------------


def test_a_format_width_does_not_fill_the_trainer():
    """Attack: a 12-character answer ('%268435456d') that the trainer's outside evaluation
    formats (`f() % 5`: a 256 MiB string before), a huge round() and a costly modular pow.
    Verdict: each check refused before its result is built (0.0), the trainer's heap peak under
    16 MiB, the call within its run time; the honest answer still 1.0."""
    (unit,) = get_reward_funcs(["python_unit_tests"], code_timeout_seconds=3)
    tests = [
        "assert f() % 5 == '    5'",
        "assert round(5, f()) == 0",
        "assert pow(f(), f(), f()) == 1",
    ]
    cheats = ["def f():\n    return '%268435456d'", "def f():\n    return -10**9"]
    cheats.append("def f():\n    return 2**13000 - 1")
    tracemalloc.start()
    try:
        start = time.monotonic()
        scores = unit([fenced(c) for c in cheats], solution=tests)
        seconds = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert scores == [0.0, 0.0, 0.0] and peak < 16 << 20 and seconds < 6, (scores, peak)
    assert unit([fenced("def f():\n    return '%5d'")], solution=tests[:1]) == [1.0]


BYTE_AT_A_TIME = (
    "import os, time\nend = time.monotonic() + 1.8\nwhile time.monotonic() < end:\n"
    "    os.write(1, b'x')\n    time.sleep(0.0005)\n"
)


def test_a_byte_at_a_time_writer_costs_the_trainer_little_cpu():
    """Attack: write stdout one byte at a time for 1.8 s, pausing between bytes so that the
    reader wakes for each (it did: 0.17-1.75 s of trainer CPU per 5 s run, 37-51 ms for this
    one on a loaded machine). Verdict: the reader coalesces (after a small read it waits 50 ms
    or until the run ends): the trainer's own CPU for the run stays under 30 ms (10-16 ms
    measured; an honest run costs 4-11 ms)."""
    run_python("pass", "", Limits())
    start = time.process_time()
    result = run_python(BYTE_AT_A_TIME, "", Limits(wall_seconds=3))
    spent = time.process_time() - start
    assert result.ok and len(result.stdout) > 100, result.stderr
    assert spent < 0.03, f"{spent:.3f} CPU-s of the trainer for one run"


# ---- forged unit-test verdicts --------------------------------------------------------------

FRAME_EDIT = (
    "import ctypes, sys\n"
    "def add(a, b):\n"
    "    caller = sys._getframe(1)\n"
    "    caller.f_locals['expected'] = -1\n"
    "    ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(caller), ctypes.c_int(0))\n"
    "    return -1\n"
)
# (tests, a wrong program aimed at them, the right program, scores: right, wrong; unjudged)
FORGED_VERDICTS = [
    (  # an imported function the program rebinds: read as math.isclose, judged here
        "from math import isclose\nassert isclose(half(3), 1.5)",
        "import math\nmath.isclose = lambda *a, **k: True\ndef half(x):\n    return 0",
        "def half(x):\n    return x / 2",
        (1.0, 0.0), False,
    ),
    (  # a module constant the program rebinds: math.pi is the trainer's
        "import math\nassert area(1) == math.pi",
        "import math\nmath.pi = 3\ndef area(r):\n    return 3",
        "import math\ndef area(r):\n    return math.pi * r * r",
        (1.0, 0.0), False,
    ),
    (  # an expected comprehension, range shadowed: not judged
        "assert squares(3) == [i * i for i in range(3)]",
        "import builtins\nbuiltins.range = lambda n: []\ndef squares(n):\n    return []",
        "def squares(n):\n    return [i * i for i in range(n)]",
        (0.0, 0.0), True,
    ),
    (  # a helper of the tests, sorted shadowed: not judged
        "def norm(x):\n    return sorted(x)\nassert order([3, 1]) == norm([1, 3])",
        "import builtins\nbuiltins.sorted = lambda x: 0\ndef order(x):\n    return 0",
        "def order(x):\n    return sorted(x)",
        (0.0, 0.0), True,
    ),
    (  # a TestCase attribute, TestCase replaced: not judged
        "import unittest\nclass T(unittest.TestCase):\n    def setUp(self):\n"
        "        self.want = 5\n    def test_add(self):\n"
        "        self.assertEqual(add(2, 3), self.want)\n",
        "import unittest\nclass Case:\n    def __init__(self, *a):\n        pass\n"
        "    def __setattr__(self, name, value):\n        object.__setattr__(self, name, -1)\n"
        "    setUpClass = classmethod(lambda cls: None)\n    tearDown = lambda self: None\n"
        "unittest.TestCase = Case\n" + "def add(a, b):\n    return -1",
        "def add(a, b):\n    return a + b",
        (0.0, 0.0), True,
    ),
    (  # an expected name bound twice, rebound through global: not judged
        "expected = 5\ndef setup():\n    global expected\n    expected = add(2, 3)\n"
        "setup()\nassert add(2, 3) == expected",
        "def add(a, b):\n    return -1",
        "def add(a, b):\n    return a + b",
        (0.0, 0.0), True,
    ),
    (  # a pytest-style local rewritten through the caller's frame: bound once, judged here
        "def test_add():\n    expected = 5\n    assert add(2, 3) == expected",
        FRAME_EDIT,
        "def add(a, b):\n    return a + b",
        (1.0, 0.0), False,
    ),
]  # fmt: skip


def test_expected_sides_the_program_can_reach_are_judged_here_or_not_at_all():
    """Attack: seven tests whose expected side was evaluated in the sandbox, with the program's
    objects (a wrong program scored 1.0 through each): math.isclose imported and rebound,
    math.pi rebound, a comprehension with range shadowed, a test helper with sorted shadowed,
    a TestCase attribute with TestCase replaced, a name bound twice and rebound through
    global, a pytest-style local rewritten through the caller's frame. Verdict: the wrong
    program 0.0 in each; the expected side is evaluated in the trainer where it is literals,
    built-ins, known module functions and constants or a name bound once to those (the right
    program 1.0), and the test is unjudged otherwise (0.0 without running, counted)."""
    (unit,) = get_reward_funcs(["python_unit_tests"], code_timeout_seconds=3)
    completions, solutions = [], []
    for tests, wrong, right, _, _ in FORGED_VERDICTS:
        completions += [fenced(right), fenced(wrong)]
        solutions += [tests, tests]
    logged: dict = {}
    scores = unit(completions, solution=solutions, log_metric=lambda k, v: logged.update({k: v}))
    expected = [score for *_, pair, _ in FORGED_VERDICTS for score in pair]
    assert scores == expected, list(zip(scores, expected, strict=True))
    unjudged = 2 * sum(flag for *_, flag in FORGED_VERDICTS)
    assert logged == {"rewards/python_unit_tests/unjudged": float(unjudged)}


# ---- a cgroup per run ------------------------------------------------------------------------

FILL_BOX = (
    "n = 0\ntry:\n    while True:\n        with open(f'f{n}', 'wb') as f:\n"
    "            f.write(b'x' * (8 << 20))\n        n += 1\n        print(n * 8, flush=True)\n"
    "except OSError as err:\n    print('error', err.errno, flush=True)\n"
)


def test_memory_outside_the_rlimits_is_bounded_by_the_runs_cgroup(caplog):
    """Attack: park pipes in flight, then fill /box (a tmpfs: pages like a memory file's, which
    RLIMIT_AS does not count) with a 64 MiB memory limit and a 256 MiB disk: 256 MiB held
    before. Verdict, where a cgroup can be made (root here: v1; a delegated v2): the run is
    killed by its leaf's memory limit before it holds 64 MiB, and the leaf is gone after the
    call. Where none can be made (an ordinary user here), the sandbox's first check logs one
    line saying so and what is then unbounded, and the files pass the memory limit (only the
    disk cap holds them)."""
    caplog.set_level("INFO", logger="maxent_grpo.rewards")
    sandbox.isolation_problem.cache_clear()
    assert sandbox.isolation_problem() is None
    bases, line = cgroup.parents()
    limits = Limits(wall_seconds=5, memory_mb=64, disk_mb=256)
    result, _, _ = _watched(PARK_PIPES.replace("print(", "(lambda *a, **k: 0)(") + FILL_BOX, limits)
    written = [int(n) for n in result.stdout.split() if n.isdigit()]
    leftovers = [
        n for b in bases for n in os.listdir(b) if n.startswith(f"maxent-run-{os.getpid()}")
    ]
    assert leftovers == [], leftovers
    if bases:
        assert result.returncode == -9 or result.returncode == 137, result
        assert max(written, default=0) < 64 and cgroup.note() is None
        assert any(line in r.getMessage() for r in caplog.records)
    else:
        assert max(written) > 64, result.stdout[-200:]  # past memory_mb: only disk_mb holds
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert cgroup.note() in warned and "no cgroup per run" in cgroup.note()

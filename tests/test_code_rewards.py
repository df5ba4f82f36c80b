"""Code rewards and their sandbox: scores, and one test per limit with a hostile program."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time

import pytest

from maxent_grpo.rewards import RewardError, get_reward_funcs
from maxent_grpo.rewards.sandbox import Limits, namespace_wrapper, run_command, run_python

FAST = Limits(wall_seconds=3)
ADD = {
    "language": "python",
    "test_cases": [{"input": "2 3", "output": "5"}, {"input": "1 1", "output": "2\n"}],
}


def fenced(code: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": f"Here you go:\n```python\n{code}\n```\n"}]


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a parent that does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def error_line(result) -> str:
    return result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""


# ---- the rewards -----------------------------------------------------------------------------


def test_code_scores_the_fraction_of_passed_cases():
    code, binary = get_reward_funcs(["code", "binary_code"])
    completions = [
        fenced("print(sum(map(int, input().split())))"),
        fenced("print(5)"),
        fenced("raise SystemExit(1)"),
        [{"role": "assistant", "content": "no code block"}],
    ]
    infos = [ADD, json.dumps(ADD), ADD, ADD]  # a mapping or its JSON text
    assert code(completions, verification_info=infos) == [1.0, 0.5, 0.0, 0.0]
    assert binary(completions, verification_info=infos) == [1.0, 0.0, 0.0, 0.0]


def test_code_compares_output_lines_without_surrounding_whitespace():
    (code,) = get_reward_funcs(["code"])
    info = {"test_cases": [{"input": "", "output": "1 2\n3"}]}  # language defaults to python
    outputs = ["print(' 1 2 ')\nprint('3')\nprint()", "print('1 2 3')", "print('1 2')"]
    assert code([fenced(o) for o in outputs], verification_info=[info] * 3) == [1.0, 0.0, 0.0]


def test_code_other_languages_and_bad_test_cases():
    (code,) = get_reward_funcs(["code"])
    cpp = {"language": "cpp", "test_cases": [{"input": "", "output": "1"}]}
    empty = {"language": "python", "test_cases": []}
    assert code([fenced("print(1)")] * 2, verification_info=[cpp, empty]) == [None, None]
    with pytest.raises(RewardError, match="verification_info"):
        code([fenced("print(1)")])
    with pytest.raises(RewardError, match="test_cases"):
        code([fenced("print(1)")], verification_info=[{"cases": []}])


def test_python_unit_tests_runs_code_then_tests():
    (unit,) = get_reward_funcs(["python_unit_tests"])
    add = fenced("def add(a, b):\n    return a + b")
    sub = fenced("def add(a, b):\n    return a - b")
    mbpp = str(["assert add(2, 3) == 5", "assert add(0, 0) == 0"])  # str() of a list column
    humaneval = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    scores = unit(
        [add, sub, add, add, "no block", add],
        solution=["assert add(2, 3) == 5", "assert add(2, 3) == 5", mbpp, humaneval, "x", None],
        entry_point=[None, None, None, "add", None, None],
    )
    assert scores == [1.0, 0.0, 1.0, 1.0, 0.0, None]
    # check(...) is only called when the row names the entry point.
    assert unit([sub], solution=[humaneval]) == [1.0]
    assert unit([sub], solution=[humaneval], entry_point=["add"]) == [0.0]


def test_code_rewards_pickle_and_keep_their_names():
    for name in ("code", "binary_code", "python_unit_tests"):
        (func,) = get_reward_funcs([name], code_timeout_seconds=2, parallel_code_exec_per_proc=1)
        clone = pickle.loads(pickle.dumps(func))
        assert clone.__name__ == name == func.__name__
        assert clone.limits == Limits(wall_seconds=2.0) and clone.workers == 1


def test_remote_providers_and_judged_rewards_are_refused_in_one_line():
    for provider in ("e2b", "morph"):
        with pytest.raises(RewardError) as err:
            get_reward_funcs(["code"], code_provider=provider)
        assert "needs a network" in str(err.value) and "\n" not in str(err.value)
    assert get_reward_funcs(["code_format"], code_provider="e2b")  # runs nothing: no network
    for name in ("ioi_code", "cf_code"):
        with pytest.raises(RewardError, match=f"reward '{name}' needs open-r1's"):
            get_reward_funcs([name])


def test_parallel_runs_are_bounded_and_faster():
    sleepy = fenced("import time\ntime.sleep(0.5)\nprint(input())")
    cases = {"test_cases": [{"input": str(i), "output": str(i)} for i in range(4)]}
    timings = {}
    for workers in (1, 2):
        (code,) = get_reward_funcs(["code"], parallel_code_exec_per_proc=workers)
        start = time.monotonic()
        assert code([sleepy], verification_info=[cases]) == [1.0]
        timings[workers] = time.monotonic() - start
    assert timings[1] >= 2.0  # four runs one after the other
    assert 1.0 <= timings[2] < timings[1] - 0.5  # two at a time, never four


# ---- the sandbox: one test per limit ---------------------------------------------------------


def test_a_plain_program_reads_stdin_and_writes_stdout():
    result = run_python("print(input()[::-1])", "abc\n", FAST)
    assert result.ok and result.stdout == "cba\n" and result.returncode == 0


def test_wall_clock_limit_kills_a_sleeping_program():
    start = time.monotonic()
    result = run_python("import time\ntime.sleep(60)", "", Limits(wall_seconds=1))
    assert result.status == "timeout" and time.monotonic() - start < 10


def test_cpu_limit_kills_an_infinite_loop():
    # Wall limit far away: RLIMIT_CPU (1 s) ends the loop, with SIGXCPU or SIGKILL.
    start = time.monotonic()
    result = run_python("while True:\n    pass", "", Limits(wall_seconds=30, cpu_seconds=1))
    assert result.status == "error" and time.monotonic() - start < 10
    assert result.returncode is not None and result.returncode != 0


def test_memory_limit_stops_a_huge_allocation():
    result = run_python("x = bytearray(8 * 1024**3)\nprint('allocated')", "", FAST)
    assert result.status == "error" and "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_file_size_limit_stops_a_huge_file_and_endless_output():
    big = run_python("open('big', 'wb').write(b'x' * (64 << 20))", "", FAST)
    assert big.status == "error" and "File too large" in big.stderr
    spam = run_python("while True:\n    print('x' * 1000)", "", FAST)
    assert spam.status == "error" and len(spam.stdout) <= FAST.output_chars


def test_fork_bomb_and_subprocesses_are_refused():
    result = run_python("import os\nwhile True:\n    os.fork()", "", FAST)
    assert result.status == "error" and "os.fork is not allowed" in result.stderr
    other = run_python("import subprocess\nsubprocess.run(['sleep', '30'])", "", FAST)
    assert other.status == "error" and "not allowed" in other.stderr


def test_processes_and_threads_are_limited_by_rlimit_nproc():
    # The kernel enforces it for every user but root (for root, the audit hook and the PID
    # namespace above do); the program sees the limit either way.
    source = "import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC))"
    assert run_python(source, "", FAST).stdout.strip() == "(0, 0)"
    raise_it = "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (100, 100))"
    assert "not allowed" in error_line(run_python(raise_it, "", FAST))


def test_the_process_group_is_killed_with_the_program(tmp_path):
    # Without the Python layers: the group kill alone ends what a program left behind.
    script = "sleep 30 & echo $! > pids; sleep 30 & echo $! >> pids; wait"
    result = run_command(["sh", "-c", script], "", Limits(wall_seconds=1), tmp_path)
    assert result.status == "timeout"
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    time.sleep(0.2)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


def test_writes_outside_the_sandbox_directory_are_refused(tmp_path):
    target = tmp_path / "trainer_file.txt"
    target.write_text("precious")
    attempts = [
        f"open({str(target)!r}, 'w').write('pwned')",
        f"open({str(tmp_path / 'new.txt')!r}, 'x')",
        f"import os\nos.remove({str(target)!r})",
        f"import os\nos.rename({str(target)!r}, 'stolen')",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('pwned')",
        f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY)",
        f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)",  # a dir_fd outside
        "import shutil\nshutil.rmtree('/tmp')",
    ]
    for source in attempts:
        result = run_python(source, "", FAST)
        assert result.status == "error" and "not allowed" in result.stderr, source
    assert target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainer_file.txt"]
    inside = run_python("open('out.txt', 'w').write('fine')\nprint(open('out.txt').read())")
    assert inside.ok and inside.stdout == "fine\n"


def test_the_sandbox_directory_is_temporary():
    result = run_python("import os\nprint(os.getcwd())", "", FAST)
    workdir = result.stdout.strip()
    assert result.ok and "maxent-sandbox-" in workdir and not os.path.exists(workdir)


def test_network_connections_are_refused():
    source = (
        "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))\n"
        "print('connected')"
    )
    result = run_python(source, "", FAST)
    assert result.status == "error" and "connected" not in result.stdout
    assert "socket.connect is not allowed" in result.stderr


@pytest.mark.skipif(not namespace_wrapper(), reason="unshare is not allowed on this machine")
def test_network_namespace_has_no_route_even_without_the_audit_hook(tmp_path):
    probe = (
        "import socket\ns = socket.socket()\ns.settimeout(2)\n"
        "try:\n    s.connect(('1.1.1.1', 80))\n    print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)"
    )
    argv = [*namespace_wrapper(), sys.executable, "-I", "-c", probe]
    result = run_command(argv, "", FAST, tmp_path)
    assert result.ok and result.stdout.startswith("refused"), result.stdout + result.stderr


def test_the_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    result = run_python("import os, sys\nprint(sorted(os.environ))\nprint(sys.path[0])", "", FAST)
    names = result.stdout.splitlines()[0]
    assert result.ok and names == str(["HOME", "LANG", "PATH", "TMPDIR"])
    assert "/somewhere" not in result.stdout and "hf_secret" not in result.stdout


def test_signals_to_other_processes_and_ctypes_are_refused():
    kill = run_python(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)", "", FAST)
    assert kill.status == "error" and "os.kill is not allowed" in kill.stderr
    ctypes = run_python("import ctypes\nctypes.CDLL(None)", "", FAST)
    assert ctypes.status == "error" and "not allowed" in ctypes.stderr

"""Code rewards and their sandbox: scores, and one test per limit with a hostile program."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time

import pytest

from maxent_grpo.rewards import RewardError, bwrap, get_reward_funcs, sandbox
from maxent_grpo.rewards.sandbox import Limits, run_command, run_python
from maxent_grpo.rewards.weak_sandbox import namespace_wrapper

FAST = Limits(wall_seconds=3)
WEAK = Limits(wall_seconds=3, isolation="weak")
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
    # check(...) is only called when the row names the entry point; an assert that never ran
    # is no pass (every check site must report), so without it even the right add scores 0.
    assert unit([add], solution=[humaneval]) == [0.0]
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


# ---- the sandbox: one test per limit (bwrap, the default; the weak mode where it differs) ------


def test_a_plain_program_reads_stdin_and_writes_stdout():
    result = run_python("print(input()[::-1])", "abc\n", FAST)
    assert result.ok and result.stdout == "cba\n" and result.returncode == 0


def test_wall_clock_limit_kills_a_sleeping_program():
    start = time.monotonic()
    result = run_python("import time\ntime.sleep(60)", "", Limits(wall_seconds=1))
    assert result.status == "timeout" and time.monotonic() - start < 10


def test_cpu_limit_kills_an_infinite_loop():
    # Wall limit far away: RLIMIT_CPU (1 s) ends the loop, with SIGXCPU or SIGKILL. "error",
    # not "timeout": the CPU limit ended it, however slowly a loaded machine let it use 1 s.
    result = run_python("while True:\n    pass", "", Limits(wall_seconds=60, cpu_seconds=1))
    assert result.status == "error", result
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
    assert "stdout over" in spam.stderr and spam.seconds < FAST.wall_seconds


def test_fork_bomb_subprocesses_and_threads_are_refused():
    # The seccomp filter answers EPERM to clone, fork and vfork: no process, no thread.
    fork = run_python("import os\nwhile True:\n    os.fork()", "", FAST)
    assert fork.status == "error" and "Operation not permitted" in fork.stderr
    other = run_python("import subprocess\nsubprocess.run(['sleep', '30'])", "", FAST)
    assert other.status == "error" and other.seconds < 3
    thread = run_python("import threading\nthreading.Thread(target=print).start()", "", FAST)
    assert thread.status == "error" and "can't start new thread" in thread.stderr


def test_the_process_group_is_killed_with_the_program(tmp_path):
    # Without the sandbox: the group kill alone ends what a program left behind.
    script = "sleep 30 & echo $! > pids; sleep 30 & echo $! >> pids; wait"
    result = run_command(["sh", "-c", script], b"", Limits(wall_seconds=1), cwd=str(tmp_path))
    assert result.status == "timeout"
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    time.sleep(0.2)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("limits", [FAST, WEAK], ids=["bwrap", "weak"])
def test_writes_outside_the_sandbox_directory_fail(tmp_path, limits):
    target = tmp_path / "trainer_file.txt"
    target.write_text("precious")
    attempts = [
        f"open({str(target)!r}, 'w').write('pwned')",
        f"open({str(tmp_path / 'new.txt')!r}, 'x')",
        f"import os\nos.remove({str(target)!r})",
        f"import os\nos.rename({str(target)!r}, 'stolen')",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('pwned')",
        f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY)",
        f"open({sys.base_prefix + '/pwned'!r}, 'w')",  # the interpreter's own installation
        "import shutil\nshutil.rmtree('/tmp')",
    ]
    for source in attempts:
        result = run_python(source, "", limits)
        assert result.status == "error", source
    assert target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainer_file.txt"]
    inside = run_python("open('out.txt', 'w').write('fine')\nprint(open('out.txt').read())")
    assert inside.ok and inside.stdout == "fine\n"


def test_the_working_directory_is_private_and_temporary():
    bwrap = run_python("import os\nprint(os.getcwd(), sorted(os.listdir('/')))", "", FAST)
    assert bwrap.ok and bwrap.stdout.split(" ", 1)[0] == "/box"
    weak = run_python("import os\nprint(os.getcwd())", "", WEAK)
    workdir = weak.stdout.strip()
    assert weak.ok and "maxent-sandbox-" in workdir and not os.path.exists(workdir)


@pytest.mark.parametrize("limits", [FAST, WEAK], ids=["bwrap", "weak"])
def test_network_connections_fail(limits):
    source = (
        "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))\n"
        "print('connected')"
    )
    result = run_python(source, "", limits)
    assert result.status == "error" and "connected" not in result.stdout


@pytest.mark.skipif(not namespace_wrapper(), reason="unshare is not allowed on this machine")
def test_weak_network_namespace_has_no_route_even_without_the_audit_hook(tmp_path):
    probe = (
        "import socket\ns = socket.socket()\ns.settimeout(2)\n"
        "try:\n    s.connect(('1.1.1.1', 80))\n    print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)"
    )
    argv = [*namespace_wrapper(), sys.executable, "-I", "-c", probe]
    result = run_command(argv, b"", FAST, cwd=str(tmp_path))
    assert result.ok and result.stdout.startswith("refused"), result.stdout + result.stderr


@pytest.mark.parametrize("limits", [FAST, WEAK], ids=["bwrap", "weak"])
def test_the_environment_is_scrubbed(monkeypatch, limits):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    source = "import os, sys\nprint(sorted(os.environ))\nprint(sys.path[0])"
    result = run_python(source, "", limits)
    names = result.stdout.splitlines()[0]
    pwd = ["PWD"] if limits.isolation == "bwrap" else []  # bwrap's --chdir sets it: /box
    assert result.ok and names == str(["HOME", "LANG", "PATH", *pwd, "TMPDIR"])
    assert "/somewhere" not in result.stdout and "hf_secret" not in result.stdout


def test_other_processes_are_out_of_reach():
    # Its own PID namespace: the trainer's pid does not exist there (or is another process).
    kill = run_python(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)", "", FAST)
    assert kill.status == "error" and alive(os.getpid())
    ps = run_python("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert ps.ok and ps.stdout.strip() in ("[1]", "[1, 2]")


def test_weak_mode_audit_hook_refuses_signals_and_ctypes():
    kill = run_python(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)", "", WEAK)
    assert kill.status == "error" and "os.kill is not allowed" in kill.stderr
    ctypes = run_python("import ctypes\nctypes.CDLL(None)", "", WEAK)
    assert ctypes.status == "error" and "not allowed" in ctypes.stderr


# ---- where bwrap cannot run ------------------------------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch):
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda n: None if n == "bwrap" else real_which(n))
    sandbox.isolation_problem.cache_clear()
    yield
    sandbox.isolation_problem.cache_clear()


def test_code_rewards_refuse_to_start_without_bwrap_in_one_line(no_bwrap):
    for name in ("code", "binary_code", "python_unit_tests"):
        with pytest.raises(RewardError) as err:
            get_reward_funcs([name])
        message = str(err.value)
        assert "bubblewrap (bwrap) is not installed" in message and "code_sandbox: weak" in message
        assert "\n" not in message
    assert get_reward_funcs(["code_format"])  # runs nothing: needs no sandbox


def test_weak_mode_is_explicit_and_logged(no_bwrap, caplog):
    sandbox._warn_weak.cache_clear()
    with caplog.at_level("WARNING", logger="maxent_grpo.rewards"):
        (code,) = get_reward_funcs(["code"], code_sandbox="weak")
    assert "code_sandbox: weak" in caplog.text and code.limits.isolation == "weak"
    assert code([fenced("print(sum(map(int, input().split())))")], verification_info=[ADD]) == [1.0]
    # Unit tests are scored by the same runner and verdict: an early exit 0 still fails.
    (unit,) = get_reward_funcs(["python_unit_tests"], code_sandbox="weak")
    right, wrong = "def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b"
    completions = [fenced(right), fenced(wrong + "\nimport os\nos._exit(0)")]
    assert unit(completions, solution=["assert add(2, 3) == 5"] * 2) == [1.0, 0.0]
    with pytest.raises(RewardError, match="code_sandbox must be one of bwrap, weak"):
        get_reward_funcs(["code"], code_sandbox="none")


def test_a_root_trainer_whose_python_nobody_cannot_reach_is_refused_in_one_line(monkeypatch):
    def no_view():
        raise OSError("cannot make /root reachable for uid 65534: mount: Operation not permitted")

    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox.bwrap, "root_view", no_view)
    sandbox.isolation_problem.cache_clear()
    try:
        with pytest.raises(RewardError) as err:
            get_reward_funcs(["code"])
    finally:
        sandbox.isolation_problem.cache_clear()
    message = str(err.value)
    assert "the trainer is root and cannot make /root reachable for uid 65534" in message
    assert "\n" not in message and "code_sandbox: weak" in message


def test_hidden_ancestors_are_the_topmost_directories_nobody_cannot_search(tmp_path):
    base = tmp_path / "base"
    (base / "open" / "shut" / "python").mkdir(parents=True)
    base.chmod(0o755)
    (base / "open" / "shut").chmod(0o700)
    tmp_path.chmod(0o755)
    above = bwrap.hidden_ancestors([str(tmp_path)])  # pytest's own directories (700)
    python = str(base / "open" / "shut" / "python")
    assert bwrap.hidden_ancestors([python]) == (above or [str(base / "open" / "shut")])
    (base / "open" / "shut").chmod(0o711)
    assert bwrap.hidden_ancestors([python]) == above


def test_end_program_kills_the_program_through_its_pidfd():
    # The pid bwrap names on its info pipe is taken only while it is the starter's child;
    # end_program kills it and returns once it is gone.
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert bwrap.program_pidfd(b'{"child-pid": %d}' % child.pid, os.getpid() + 1) is None
        pidfd = bwrap.program_pidfd(b'{"child-pid": %d}' % child.pid, os.getpid())
        assert pidfd is not None and bwrap.end_program(pidfd)
        assert child.wait(5) == -9
    finally:
        child.kill()
        child.wait()
    assert bwrap.program_pidfd(b"not json", os.getpid()) is None and bwrap.end_program(None)


def test_the_lifetime_mechanism_is_said_in_one_line(caplog):
    sandbox.isolation_problem.cache_clear()
    with caplog.at_level("INFO", logger="maxent_grpo.rewards"):
        assert sandbox.isolation_problem() is None
    (line,) = [r.getMessage() for r in caplog.records if "code sandbox: bwrap" in r.getMessage()]
    assert "pid 1 of its own PID namespace" in line and "cgroup" in line
    if not sandbox.cgroup.parents()[0]:  # and, where no leaf can be made, a warning saying so
        assert sandbox.cgroup.note() in [r.getMessage() for r in caplog.records]


def test_check_counts_the_tests_that_cannot_be_judged_outside():
    """A dataset's rows whose expected side needs the sandbox's objects (a comprehension, a
    helper of the tests, an attribute of self, a loop variable), catch exceptions or do not
    parse are counted without running anything; literals, math.pi, an imported isclose, a
    pytest-style local and HumanEval's check(candidate) are judged."""
    from maxent_grpo.rewards.code import count_unjudged

    judged = [
        "assert add(2, 3) == 5",
        "import math\nassert area(1) == math.pi",
        "from math import isclose\nassert isclose(half(3), 1.5)",
        "def test_a():\n    expected = [1, 2]\n    assert f() == expected",
        "def check(candidate):\n    assert candidate(1) == 2\n",
        "s = Solution()\nassert s.solve([2, 7]) == [0, 1]",
    ]
    unjudged = [
        "assert f(3) == [i * i for i in range(3)]",
        "def norm(x):\n    return sorted(x)\nassert f([3, 1]) == norm([1, 3])",
        "for x in range(3):\n    assert f(x) == x * 2",
        "assert f(",
    ]
    entries = [None] * 4 + ["inc", None] + [None] * 4
    assert count_unjudged(judged + unjudged, entries) == len(unjudged)
    assert count_unjudged(judged, entries[:6]) == 0


def test_check_says_how_many_rows_of_a_local_dataset_it_cannot_judge(tmp_path, tiny_model, capsys):
    from helpers.recipes import write_recipe
    from maxent_grpo import cli

    data = tmp_path / "code.jsonl"
    tests = ["assert add(2, 3) == 5", "assert f(3) == [i * i for i in range(3)]", "assert f("]
    data.write_text("".join(json.dumps({"problem": "p", "solution": t}) + "\n" for t in tests))
    keys = dict(dataset_name=str(data), dataset_prompt_column="problem")
    keys.update(dataset_answer_column="solution", model_name_or_path=str(tiny_model))
    keys.update(code_sandbox="weak")  # counting runs nothing: any sandbox will do
    path = write_recipe(tmp_path, reward_funcs=["python_unit_tests"], reward_weights=None, **keys)
    assert cli.main(["check", "--config", str(path)]) == 0
    said = capsys.readouterr()
    assert f"python_unit_tests: 2 of 3 rows of {data} have tests it cannot judge" in said.out
    # the judged rows alone: no line
    data.write_text(json.dumps({"problem": "p", "solution": tests[0]}) + "\n")
    assert cli.main(["check", "--config", str(path)]) == 0
    assert "cannot judge" not in capsys.readouterr().out

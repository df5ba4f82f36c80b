"""Running `maxent-grpo check` / `migrate` in-process on recipes written for a GPU machine
(tests/test_migrate.py, tests/test_upstream_migration.py): a stand-in vLLM distribution, a
scratch working directory, and the command's exit code and output."""

from __future__ import annotations

import pytest

from maxent_grpo import cli


@pytest.fixture
def vllm_installed(tmp_path, monkeypatch):
    """An importable `vllm` with its distribution metadata (0.31.0), nothing else: what the
    package check looks for on a machine that will run the server."""
    stand_in_vllm(tmp_path / "site", monkeypatch)


def stand_in_vllm(site, monkeypatch) -> None:
    """vllm_installed's stand-in, in `site`, for fixtures of any scope (a MonkeyPatch)."""
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    meta = site / "vllm-0.31.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    monkeypatch.syspath_prepend(str(site))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err

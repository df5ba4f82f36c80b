"""A test that leaves files in the checkout fails (helpers/clean_checkout.py): `make test`
once wrote run logs into the repository's logs/, and `maxent-grpo runs` showed a phantom run."""

from __future__ import annotations

pytest_plugins = ["pytester"]


def test_a_test_that_leaves_a_run_log_in_the_checkout_fails(pytester, monkeypatch):
    monkeypatch.setenv("MAXENT_GRPO_CLEAN_CHECKOUT", "1")  # make test sets it
    # A stand-in checkout: a probe in the real logs/ was blamed on another xdist worker's test.
    fake = pytester.path / "checkout"
    (fake / "logs").mkdir(parents=True)
    monkeypatch.setenv("MAXENT_GRPO_CLEAN_CHECKOUT_ROOT", str(fake))
    probe = fake / "logs" / "probe_train.log"
    pytester.makepyfile(
        f"""
        from pathlib import Path

        def test_leaves():
            Path({str(probe)!r}).write_text("x")

        def test_tidy(tmp_path):
            (tmp_path / "x").write_text("x")

        def test_ends_while_another_checks_an_output_dir():
            # `check`'s writability probe, made and removed at once by another worker's run
            Path({str(fake / ".write-test-abc")!r}).mkdir()
        """
    )
    result = pytester.runpytest_inprocess("-p", "helpers.clean_checkout", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines([f"*test_leaves left files in the checkout: logs/{probe.name}*"])

"""The recipe check of the benchmark keys: run with the other recipe checks (preflight.py),
before a job is queued and before any model loads. Each problem is one line naming the
benchmark and the fix."""

from __future__ import annotations

import shutil

from maxent_grpo.benchmarks.spec import parse_benchmarks
from maxent_grpo.errors import ConfigError, UserError


def check_benchmarks(script, training) -> None:
    """Every benchmark parses, its reward resolves and its data is there (built-in and local
    columns; offline, a hub dataset in the cache); benchmark_mode slurm needs sbatch."""
    from maxent_grpo.benchmarks.data import check_data, where  # imports datasets: seconds
    from maxent_grpo.rewards import get_reward_funcs  # imports sympy (math rewards)

    benches = parse_benchmarks(script.benchmarks, script.system_prompt)
    if not benches:
        return
    settings = script.reward_settings(training.max_completion_length)
    for index, bench in enumerate(benches):
        label = where(index, bench)
        try:
            get_reward_funcs([bench.reward], **settings)
            check_data(bench, script, label)
        except ConfigError:
            raise
        except UserError as exc:
            message = str(exc)
            line = message if message.startswith(label) else f"{label}: {message}"
            raise ConfigError(line) from None
    if script.benchmark_mode == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError(
            "benchmark_mode: 'slurm' but sbatch is not on PATH here; set benchmark_mode: inline "
            "(or auto: slurm inside a Slurm job, inline elsewhere)"
        )

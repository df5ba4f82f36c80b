"""Benchmarks that score checkpoints (docs/evaluation.md).

- `benchmarks`: how a recipe names and declares benchmarks (`benchmarks:`), parsed and checked;
- `checks`: the recipe check of the benchmark keys (before any model loads);
- `data`: a benchmark's rows (built-in held-out splits, local files, the hub);
- `generate`: completions (vLLM when installed with a GPU, else transformers);
- `scoring`: pass@k (unbiased estimator) over the problems;
- `ledger`: what the run's event log says was queued, scored, skipped or failed;
- `run`: one evaluation of one checkpoint, into the event log;
- `schedule`: the trainer's side (queue a Slurm job per checkpoint, or evaluate inline);
- `command`: `maxent-grpo eval`.

Importing this package is cheap: the modules import torch, transformers or vLLM only when
they generate.
"""

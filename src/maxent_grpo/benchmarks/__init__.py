"""Benchmarks a recipe scores its checkpoints on: their specification (spec.py, pure), their
data (data.py) and their recipe check (checks.py). Above data/ and rewards/, below the
trainers and the evaluation jobs (evaluate/), which both use them."""

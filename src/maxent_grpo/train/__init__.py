"""Training: the entry point, complete checkpoints, stop requests and vLLM weight sync.

Importing this package is cheap (no torch, TRL or transformers): the launcher and
`maxent-grpo runs` read checkpoints through it.
"""

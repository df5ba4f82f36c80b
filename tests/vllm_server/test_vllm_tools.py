"""Tools with generation on a real vLLM server (CPU build): TRL's tool-calling loop sends every
turn to the server, the tool runs in between, and the tool result is in the episode but out of
the policy's tokens.

What stands in for what: the tiny random model would never write a tool call, so the server's
sampling is held to one by TRL's `vllm_structured_outputs_regex` (vLLM's structured outputs):
every turn is a Qwen2.5 `<tool_call>` of `m(6, 7)` or `m(6, 8)` (a small tool with a short
schema: every turn asks the server for max_completion_length tokens after the prompt, which
holds the tools' schemas, and vllm_max_model_length must hold both). With
max_tool_calling_iterations 1 the first call runs, its result is appended, the server generates
a second turn (another call, not run: the limit). Everything else is real: the launcher's
trainers in server mode against the session's shared disk-sync server (shared_servers.py; the
recipe would start the very same one), disk weight sync, 2 steps on 2 CPU processes.
"""

from __future__ import annotations

import json

import pytest
from shared_servers import SHARED_KEYS, plan_on

from helpers.paths import REPO
from helpers.recipes import SMOKE, SMOKE_VLLM, write_recipe
from helpers.runs import run
from helpers.scripted_policy import qwen25_template
from maxent_grpo.rundir.checkpoints import run_is_complete
from maxent_grpo.rundir.events import read_events

pytestmark = pytest.mark.vllm

HELPERS = REPO / "tests" / "helpers"

CALL = r'<tool_call>\n\{"name":"m","arguments":\{"a":6,"b":[78]\}\}\n</tool_call>'


def test_tool_episodes_generate_through_the_server(tmp_path, tiny_model, disk_server):
    import yaml

    server_keys = {
        k: v
        for k, v in yaml.safe_load(SMOKE_VLLM.read_text()).items()
        if k == "use_vllm" or k.startswith("vllm_")
    }
    out = tmp_path / "out"
    lengths_file = tmp_path / "episode_lengths.jsonl"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE,
        # The tool's schema is in each prompt: 1024 tokens (the shared server's).
        **{**server_keys, **SHARED_KEYS["disk"]},
        vllm_structured_outputs_regex=CALL,
        model_name_or_path=str(tiny_model),
        system_prompt="Be brief.",  # shorter than the template's default system message
        tools=[f"{HELPERS}/tool_envs.py:m"],
        max_tool_calling_iterations=1,
        chat_template=qwen25_template(),
        reward_funcs=[f"{HELPERS}/tool_rewards.py:episode_lengths"],
        env={"OMP_NUM_THREADS": "1", "TOOL_EPISODE_LENGTHS": str(lengths_file)},
        reward_weights=None,
        num_generations=2,
        per_device_train_batch_size=2,
        # Each turn asks the server for this many tokens after its prompt + episode so far,
        # which TRL keeps within it: `check` refuses unless the longest prompt (741 tokens
        # with the template's tool preamble) + 2 x this fits 1024 (rewards/context.py). The
        # episode (call ~43, tool turn ~63, a second call) passes it: the second call is cut.
        max_completion_length=140,
        max_steps=2,
        save_steps=1000,
    )
    plan, env = plan_on(disk_server, recipe)
    result = run(list(plan.train.command), timeout=900, **env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert run_is_complete(out)
    steps = {
        int(e["step"]): e["metrics"]
        for e in read_events(out)
        if e["event"] == "step" and "tools/call_frequency" in e.get("metrics", {})
    }
    print(f"\nMEASURED tool steps through the server: {steps}")
    assert sorted(steps) == [1, 2]
    for metrics in steps.values():
        # One call ran per episode (the second turn's call is past the limit), none failed.
        assert metrics["tools/call_frequency"] == 1.0
        assert metrics["tools/failure_frequency"] == 0.0
    # TRL's completion lengths count the policy's tokens (tool_mask 1); the episodes the
    # reward saw are longer by the tool result (<tool_response>, the number, the role tags).
    episodes = [n for line in lengths_file.read_text().splitlines() for n in json.loads(line)]
    full = sum(episodes) / len(episodes)  # both steps, both processes
    policy = sum(m["completions/mean_length"] for m in steps.values()) / len(steps)
    print(f"MEASURED mean episode {full:.1f} tokens, of which the policy's {policy:.1f}")
    assert len(episodes) == 8 and 30 <= full - policy <= 100  # 63 here: the tool turn
    # Not checked: sampling/sampling_logp_difference. Structured outputs make vLLM report the
    # constrained distribution's logprobs (0 for a forced token), ~ln(vocabulary) away from the
    # model's own; the trainer's logprobs are checked on CPU in tests/test_tool_episode.py.

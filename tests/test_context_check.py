"""`check` refuses a server-mode recipe whose longest request passes vllm_max_model_length
(the vLLM server's HTTP 400 ends a run mid-step): the longest prompt, measured with the
policy's tokenizer and the tools' schemas, + max_completion_length per turn (twice with tools:
TRL asks for it again after a tool call, rewards/context.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers.scripted_policy import qwen25_template
from maxent_grpo.errors import ConfigError
from maxent_grpo.preflight import check_context
from maxent_grpo.recipe.script_keys import ScriptArguments
from maxent_grpo.rewards.common import RewardError
from maxent_grpo.rewards.context import fits_context as fits
from maxent_grpo.rewards.context import longest_prompt, schema_tools

TOOL = "helpers.tool_envs:m"


def test_the_bound_is_one_completion_per_request_and_two_after_a_tool_call():
    fits(1000, 300, False, 700, "measured")  # 700 + 300
    fits(1000, 150, True, 700, "measured")  # 700 + 2 x 150
    with pytest.raises(RewardError) as info:
        fits(1000, 151, True, 700, "measured over 4 rows of x")
    message = str(info.value)
    assert message.startswith("vllm_max_model_length: 1000 but the longest prompt (700 tokens")
    assert "2 x max_completion_length (2 x 151" in message and "= 1002 tokens" in message
    assert "raise vllm_max_model_length to 1002 or more" in message and "\n" not in message
    with pytest.raises(RewardError, match=r"\+ max_completion_length \(301\) = 1001 tokens"):
        fits(1000, 301, False, 700, "measured")


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = qwen25_template()  # renders tool schemas (the tiny one does not)
    return tokenizer


def test_prompts_are_measured_as_trl_tokenizes_them(tokenizer):
    from maxent_grpo.rewards.registry import load_callable

    chat = [[{"role": "user", "content": "What is 2 plus 3?"}], [{"role": "user", "content": "1"}]]
    alone = len(tokenizer.apply_chat_template(chat[0], add_generation_prompt=True)["input_ids"])
    assert longest_prompt(chat, tokenizer, []) == alone
    assert longest_prompt(["12345 + 1"], tokenizer, []) == len(tokenizer("12345 + 1")["input_ids"])
    tools = schema_tools([load_callable(TOOL)], None)
    with_schema = longest_prompt(chat, tokenizer, tools)
    assert with_schema > alone  # the tools' schemas are part of every prompt


def _args(tiny_model, limit: int, completion: int, **script):
    script = ScriptArguments(dataset_name="builtin:arithmetic", dataset_num_rows=32, **script)
    training = SimpleNamespace(
        use_vllm=True,
        vllm_mode="server",
        vllm_max_model_length=limit,
        max_completion_length=completion,
        max_tool_calling_iterations=None,
        trust_remote_code=False,
        chat_template=qwen25_template(),
    )
    return (
        script,
        training,
        SimpleNamespace(model_name_or_path=str(tiny_model), model_revision=None),
    )


def test_check_measures_the_recipe_data_and_refuses_what_does_not_fit(tiny_model):
    from maxent_grpo.rewards.registry import load_callable

    script, training, model = _args(tiny_model, 256, 64, tools=[TOOL])
    tools = [load_callable(TOOL)]  # as check_rewards resolves them
    with pytest.raises(ConfigError) as info:
        check_context(script, training, model, tools)
    message = str(info.value)
    assert (
        "tokens, measured over 32 rows of builtin:arithmetic) + 2 x max_completion_length"
        in message
    )
    prompt = int(message.split("longest prompt (")[1].split(" tokens")[0])
    # Just enough room passes; one token less is refused; no tools: one completion.
    check_context(
        script,
        SimpleNamespace(**{**vars(training), "vllm_max_model_length": prompt + 128}),
        model,
        tools,
    )
    with pytest.raises(ConfigError):
        check_context(
            script,
            SimpleNamespace(**{**vars(training), "vllm_max_model_length": prompt + 127}),
            model,
            tools,
        )
    plain, training, model = _args(tiny_model, 256, 64)
    check_context(
        plain, SimpleNamespace(**{**vars(training), "vllm_max_model_length": prompt + 64}), model
    )
    # Not server mode, or no vllm_max_model_length: nothing to check.
    check_context(script, SimpleNamespace(**{**vars(training), "vllm_mode": "colocate"}), model)
    check_context(
        script, SimpleNamespace(**{**vars(training), "vllm_max_model_length": None}), model
    )


def test_a_mixture_is_measured_over_its_local_and_builtin_sources_not_the_hub(tiny_model, tmp_path):
    """A mixture's builtin and local entries are loaded as training loads them (one long
    local prompt decides the bound); a hub entry cannot be read here: a note says so."""
    import json

    from maxent_grpo.data import parse_mixture

    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"problem": "What is 1 + 1? " * 40, "solution": "2"}) + "\n")
    entries = [{"id": "builtin:arithmetic", "weight": 0.5}, {"path": str(long)}]
    script, training, model = _args(tiny_model, 256, 64)

    def measured(datasets) -> tuple[int, str, list]:
        mixed = ScriptArguments(
            dataset_mixture=parse_mixture({"datasets": datasets}), dataset_num_rows=32
        )
        with pytest.raises(ConfigError) as info:
            check_context(mixed, training, model)  # 256 is too short for the long prompt
        message = str(info.value)
        prompt = int(message.split("longest prompt (")[1].split(" tokens")[0])
        fits = SimpleNamespace(**{**vars(training), "vllm_max_model_length": prompt + 64})
        return prompt, message, check_context(mixed, fits, model)

    prompt, message, notes = measured(entries)
    assert prompt > 160 and f"measured over 17 rows of builtin:arithmetic, {long})" in message
    assert notes == []
    with_hub, message, notes = measured([*entries, {"id": "org/math-prompts"}])
    assert with_hub == prompt and "rows of builtin:arithmetic, " in message
    assert f"{long}; org/math-prompts not read)" in message
    assert notes == [
        "vllm_max_model_length: the prompts of org/math-prompts (hub) are not measured: no hub "
        "access before training; only the rest of each request was checked"
    ]
    # The hub alone: nothing to measure, the completion part is still checked.
    hub = ScriptArguments(dataset_name="org/math-prompts")
    assert check_context(hub, training, model) == [notes[0]]
    short = SimpleNamespace(**{**vars(training), "vllm_max_model_length": 63})
    with pytest.raises(ConfigError, match=r"not measured: a hub dataset is read when training"):
        check_context(hub, short, model)

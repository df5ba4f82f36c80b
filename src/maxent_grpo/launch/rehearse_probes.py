"""The rehearsal's checks that need no training run: the recipe's rewards on its real rows, its
prompts through the chat template, its tools called once, the code sandbox.

Each returns a plain dict for the passport (launch/plan/rehearse.py). They get the recipe's
built sections (script arguments, training arguments, model arguments) as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from maxent_grpo.errors import UserError

PROBE_ROWS = 8  # real rows each reward is scored on
PROMPT_ROWS = 256  # prompts measured through the chat template
CODE_REWARDS = {"code", "binary_code", "python_unit_tests"}


def _candidates(row: dict, answer_column: str | None) -> list[str]:
    """Completions to score for one row: the reference answer (and every other text column) as
    given, in <answer> tags, in \\boxed{}, in a python block; and two that answer nothing."""
    texts = [str(row[answer_column])] if answer_column and answer_column in row else []
    texts += [str(v) for k, v in row.items() if k not in ("prompt", answer_column)]
    texts = [t for t in texts if t and len(t) < 4000][:4]
    out = []
    for text in texts:
        out += [
            text,
            f"<think>\nreasoning\n</think>\n<answer>\n{text}\n</answer>",
            f"\\boxed{{{text}}}",
            f"```python\n{text}\n```",
        ]
    return [*out, "", "I do not know."]


def _score(func, completions: list, columns: dict, prompts: list) -> tuple[list, int, str]:
    """func on the batch; when it raises, sample by sample: (scores, failures, first error)."""
    extra = {"prompts": prompts, "trainer_state": None}
    extra.update(log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
    try:
        return list(func(completions, **columns, **extra)), 0, ""
    except Exception:  # noqa: BLE001 - user code: counted one sample at a time below
        pass
    scores, failures, first = [], 0, ""
    for i, completion in enumerate(completions):
        sample = {k: [v[i]] for k, v in columns.items()}
        try:
            scores += list(func([completion], **sample, **{**extra, "prompts": [prompts[i]]}))
        except Exception as exc:  # noqa: BLE001
            failures += 1
            scores.append(None)
            first = first or f"{type(exc).__name__}: {exc}"[:200]
    return scores, failures, first


def reward_probe(script, training, train_rows) -> dict:
    """Every reward function of the recipe on PROBE_ROWS real rows (candidates per row)."""
    from maxent_grpo.rewards import get_reward_funcs  # sympy: seconds
    from maxent_grpo.rewards.environments import (
        get_environment,
        reward_names,
    )  # imports transformers

    environment = get_environment(script.environment, script.tool_settings())
    names = [n for n in reward_names(script.reward_funcs, environment) if "rehearsal" not in n]
    funcs = get_reward_funcs(names, **script.reward_settings(training.max_completion_length))
    rows = [dict(train_rows[i]) for i in range(min(PROBE_ROWS, len(train_rows)))]
    found = {}
    for name, func in zip(names, funcs):
        if isinstance(func, str):  # a reward model: TRL loads and scores it
            continue
        completions, columns, prompts = [], {}, []
        for row in rows:
            for text in _candidates(row, script.dataset_answer_column):
                chat = isinstance(row.get("prompt"), list)
                completions.append([{"role": "assistant", "content": text}] if chat else text)
                prompts.append(row.get("prompt"))
                for key, value in row.items():
                    if key != "prompt":
                        columns.setdefault(key, []).append(value)
        scores, failures, first = _score(func, completions, columns, prompts)
        values = {round(float(s), 6) for s in scores if s is not None}
        found[str(name)] = {
            "rows": len(rows),
            "calls": len(completions),
            "failures": failures,
            "first_error": first,
            "distinct": len(values),
            "value": next(iter(values)) if len(values) == 1 else None,
        }
    return found


def prompt_fit(script, training, model, original: dict, train_rows, tiny: str) -> dict:
    """The prompts through the chat template, against what the recipe's server allows."""
    from transformers import AutoTokenizer  # seconds

    from maxent_grpo.rewards.context import schema_tools  # imports transformers
    from maxent_grpo.rewards.environments import get_environment  # imports transformers
    from maxent_grpo.rewards.tools import get_tools  # imports transformers

    source = original.get("model_name_or_path") or tiny
    local = Path(str(source)).is_dir()
    tokenizer = AutoTokenizer.from_pretrained(source if local else tiny)
    if training.chat_template is not None:
        tokenizer.chat_template = training.chat_template
    try:
        tools = get_tools(script.tools, script.tool_settings())
        environment = get_environment(script.environment, script.tool_settings())
    except UserError:  # the tools row says why; the prompts are measured without them
        tools, environment = [], None
    schemas = schema_tools(tools, environment) or None
    lengths = []
    for i in range(min(PROMPT_ROWS, len(train_rows))):
        prompt = train_rows[i]["prompt"]
        if isinstance(prompt, list):
            out = tokenizer.apply_chat_template(
                [prompt], tools=schemas, add_generation_prompt=True, tokenize=True
            )
            lengths.append(len(out["input_ids"][0] if isinstance(out, Mapping) else out[0]))
        else:
            lengths.append(len(tokenizer(text=prompt)["input_ids"]))
    limit, why = _prompt_limit(original)
    return {
        "rows": len(lengths),
        "tokenizer": f"the recipe's, {source}"
        if local
        else "the tiny one's: the recipe's "
        f"({source}) is not on this disk, so counts are the tiny tokenizer's",
        "longest": max(lengths, default=0),
        "limit": limit,
        "why": why,
        "over": sum(1 for n in lengths if limit is not None and n > limit),
    }


def _prompt_limit(original: dict) -> tuple[int | None, str]:
    """Tokens a prompt may have: the recipe's vLLM context less what each turn asks for."""
    context = original.get("vllm_max_model_length")
    if not (original.get("use_vllm") and original.get("vllm_mode") == "server" and context):
        return None, ""
    completion = int(original.get("max_completion_length") or 256)
    turns = 2 if original.get("tools") or original.get("environment") else 1
    why = f"vllm_max_model_length {context} - {turns} x max_completion_length {completion}"
    return int(context) - turns * completion, why


def tool_probe(script) -> dict | None:
    """The recipe's tools load here and answer one call each (the built-in python tool: a
    program; others: their schema's first string argument)."""
    if not (script.tools or script.environment):
        return None
    from maxent_grpo.rewards.environments import get_environment  # imports transformers
    from maxent_grpo.rewards.tools import get_tools  # imports transformers

    names = [str(n) for n in script.tools or []]
    try:
        tools = get_tools(script.tools, script.tool_settings())
        environment = get_environment(script.environment, script.tool_settings())
    except UserError as exc:
        return {"names": names, "error": str(exc)}
    if environment is not None:
        names.append(f"environment {script.environment}")
    probe, problem = {}, ""
    for name, tool in zip(script.tools or [], tools):
        if str(name) == "python":
            out = str(tool(code="print(6*7)")).strip()
            probe["python"] = "print(6*7) -> " + out[:40]
            if out != "42":
                problem = f"tools: the python tool answered {out[:80]!r} to print(6*7), not 42"
        else:
            probe[str(name)] = "loaded (its arguments are the model's to choose)"
    return {"names": names, "probe": probe, "probe_error": problem}


def sandbox_probe(script, reward_names: list[str]) -> dict | None:
    """The code sandbox runs a program on this node, where a code reward or tool needs it."""
    uses = sorted(CODE_REWARDS & set(map(str, reward_names)))
    if "python" in map(str, script.tools or []):
        uses.append("the python tool")
    if not uses:
        return None
    isolation = script.code_sandbox
    if isolation == "weak":
        return {"ok": True, "seen": f"code_sandbox: weak (in-process audit hook) for {uses}"}
    from maxent_grpo.rewards.sandbox import isolation_problem  # code rewards only

    problem = isolation_problem()
    if problem is None:
        return {"ok": True, "seen": f"bwrap ran print(6 * 7) -> 42, for {', '.join(uses)}"}
    return {
        "ok": False,
        "seen": f"needed by {', '.join(uses)}",
        "fix": f"code rewards: {problem}; or code_sandbox: weak (docs/code-rewards.md)",
    }

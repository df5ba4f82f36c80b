"""Rollout functions in the trainer: what the recipe's `rollout_func` gets to work with, and an
example, `self_check` (docs/rollouts.md "Your own rollout function").

TRL's GRPOTrainer calls the function (maxent_grpo/rollout_func.py: the contract and the check)
inside its `_generate`, so our components still apply around it: the step clock and the
heartbeat time it, the rollout rounds call it once per round and filter what it returns, vLLM
weights are pushed before it (TRL pushes once per step; our sync applies the interval).
`tokenize` and `generate` below give a function TRL's own prompt rendering and generation
call: vLLM server (one or several servers, train/server_pool.py), colocate, or the model's own
`generate` without vLLM, whichever the recipe uses. Importing this module is cheap (the
recipe's check imports the function by name).
"""

from __future__ import annotations

from maxent_grpo.rollout_func import find_rollout_func
from maxent_grpo.train import trl_adapter

# What self_check appends to a finished answer before the model's second turn.
CHECK_TEXT = "\nWait, let me check that answer.\n"


def trainer_arguments(training_args) -> dict:
    """GRPOTrainer's `rollout_func` argument, when the recipe names one."""
    name = getattr(training_args, "rollout_func", None)
    return {"rollout_func": find_rollout_func(name)} if name else {}


def tokenize(trainer, prompts: list) -> list[list[int]]:
    """The prompts' token ids as TRL renders them (chat template, tools, template kwargs)."""
    prompt_ids, _, _ = trl_adapter.tokenize_prompts(trainer, prompts)
    return [list(ids) for ids in prompt_ids]


def completions_per_prompt(trainer) -> int:
    """How many completions each distinct prompt gets (training or evaluation)."""
    return trainer.num_generations if trainer.model.training else trainer.num_generations_eval


def generate(trainer, prompt_ids: list[list[int]], num_generations: int):
    """(completion_ids, logprobs or None) per row of `prompt_ids`, with the recipe's sampling
    and backend. `prompt_ids` must hold each prompt `num_generations` times in a row (vLLM
    generates once per distinct prompt); 1 when every row has its own history. Every process
    must call it the same number of times (server mode gathers every process's prompts)."""
    return trl_adapter.generate_single_turn(trainer, prompt_ids, num_generations)


def self_check(prompts: list, trainer) -> dict:
    """A two-turn self-check: the model answers; a finished answer (ended with EOS, room left)
    gets CHECK_TEXT appended in place of its EOS and the model continues, checking it; the
    completion trained on is answer + check text + second turn, the check text out of the loss
    (`env_mask` 0) and its log-probabilities 0. `self_checked` (per row) reaches the rewards."""
    from maxent_grpo.train.group_batches import text_tokenizer  # imports torch, transformers

    prompt_ids = tokenize(trainer, prompts)
    first, first_logps = generate(trainer, prompt_ids, completions_per_prompt(trainer))
    check = text_tokenizer(trainer).encode(CHECK_TEXT, add_special_tokens=False)
    limit, stops = trainer.max_completion_length, set(trainer.eos_token_ids)
    # Every row gets a second turn, used or not: each process makes the same generation calls.
    second, second_logps = generate(
        trainer, [p + a[:-1] + check for p, a in zip(prompt_ids, first, strict=True)], 1
    )
    completions, masks, logps, checked = [], [], [], []
    for row, answer in enumerate(first):
        answer = list(answer)
        room = limit - (len(answer) - 1) - len(check)
        done = bool(answer) and answer[-1] in stops and room > 0
        checked.append(done)
        if not done:  # cut at the length limit (or empty): no room to check it
            completions.append(answer)
            masks.append([1] * len(answer))
            logps.append(list(first_logps[row]) if first_logps is not None else None)
            continue
        reply = list(second[row])[:room]
        completions.append(answer[:-1] + check + reply)
        masks.append([1] * (len(answer) - 1) + [0] * len(check) + [1] * len(reply))
        if first_logps is not None:
            logps.append(
                list(first_logps[row][:-1]) + [0.0] * len(check) + list(second_logps[row][:room])
            )
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completions,
        "logprobs": logps if first_logps is not None else None,
        "env_mask": masks,
        "self_checked": checked,
    }

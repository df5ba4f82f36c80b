"""`prompt_template`: each prompt as plain text around the row's prompt, instead of chat messages.

Upstream maxent-grpo named three templates (those of the SEED-GRPO / OAT code: `r1`,
`qwen_math`, `no`); a recipe may also give its own, a `str.format` text with a `{prompt}`
placeholder and, for the recipe's system_prompt, a `{system}` one. TRL receives the rendered
text as a standard (not conversational) prompt, so the tokenizer's chat template is not applied.
"""

from __future__ import annotations

import string

from maxent_grpo.data.errors import DataError

# The named templates as format texts (literal braces doubled).
NAMED_TEMPLATES = {
    "r1": (
        "A conversation between User and Assistant. The User asks a question, and the "
        "Assistant solves it. The Assistant first thinks about the reasoning process in the "
        "mind and then provides the User with the answer. The reasoning process is enclosed "
        "within <think> </think> and answer is enclosed within <answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think> <answer> answer here "
        "</answer>.\nUser: {prompt}\nAssistant: <think>"
    ),
    "qwen_math": (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{{}}.<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ),
    "no": "{prompt}",
}
PLACEHOLDERS = ("prompt", "system")


def _fields(text: str) -> set[str]:
    """The placeholder names of a format text; a malformed one is a DataError."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as exc:
        raise DataError(
            f"prompt_template: {text!r} is not a valid template ({exc}); write literal braces "
            "as {{ and }}"
        ) from None


def resolve_template(value: str, system_prompt: str | None) -> str:
    """The format text of a recipe's prompt_template (a name or a text), checked: it has
    `{prompt}`, no other placeholder than `{system}`, and `{system}` exactly when
    system_prompt is set (a template without it would drop the system prompt silently)."""
    text = NAMED_TEMPLATES.get(value, value)
    names = _fields(text)
    unknown = sorted(names - set(PLACEHOLDERS))
    if unknown:
        raise DataError(
            f"prompt_template: unknown placeholder {{{unknown[0]}}}; the placeholders are "
            "{prompt} and {system} (literal braces are written {{ }})"
        )
    if "prompt" not in names:
        named = ", ".join(NAMED_TEMPLATES)
        raise DataError(
            f"prompt_template: {value!r} has no {{prompt}} placeholder, where each row's "
            f"prompt goes; add it, or use a named template ({named})"
        )
    if system_prompt and "system" not in names:
        raise DataError(
            f"prompt_template: {value!r} has no {{system}} placeholder, so system_prompt would "
            "be dropped; add {system} to a template of your own, or unset system_prompt"
        )
    if "system" in names and not system_prompt:
        raise DataError(
            "prompt_template: has a {system} placeholder but system_prompt is not set; set "
            "system_prompt or remove {system}"
        )
    return text


def render(text: str, prompt: str, system_prompt: str | None) -> str:
    """One prompt in a resolved template."""
    return text.format(prompt=prompt, system=system_prompt or "")


def check_prompt_template(args) -> None:
    """The recipe's prompt_template, if any, is usable (preflight: before a job is queued)."""
    if args.prompt_template is not None:
        resolve_template(args.prompt_template, args.system_prompt)

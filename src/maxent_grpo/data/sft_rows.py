"""A recipe's rows as SFT rows (`method: sft`, docs/sft.md): TRL's prompt-completion format."""

from __future__ import annotations

from maxent_grpo.data.load import ANSWER_COLUMN_OUT


def prompt_completion(dataset):
    """The recipe's rows (data/load.py: `prompt` and the answer column) as TRL's
    prompt-completion rows: the answer is the assistant's reply (a chat prompt) or the text
    after the prompt (a prompt_template), and the loss is on it alone (TRL's
    completion_only_loss)."""
    if ANSWER_COLUMN_OUT not in dataset.column_names:
        return dataset

    def convert(row: dict) -> dict:
        answer = row[ANSWER_COLUMN_OUT]
        if isinstance(row["prompt"], str):
            return {"completion": answer}
        return {"completion": [{"role": "assistant", "content": answer}]}

    return dataset.map(convert, remove_columns=[ANSWER_COLUMN_OUT])

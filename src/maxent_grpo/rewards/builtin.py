"""The built-in reward functions (registry names in :mod:`maxent_grpo.rewards.registry`).

They are module-level functions named after their registry names, or instances of
module-level classes for the parametrised ones, so that they pickle (TRL's async GRPO
rollout worker sends reward functions to a spawned process; closures do not pickle)
and TRL logs them under ``rewards/<name>/mean`` (it uses ``__name__``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from maxent_grpo.rewards.answers import correctness, last_answer_block, last_boxed, parse_answer
from maxent_grpo.rewards.common import RewardError, contents, references

# open-r1's format_reward pattern, with the same flags.
_FORMAT_RE = re.compile(
    r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE
)


def accuracy(completions: Sequence[Any], solution: Any = None, **kwargs: Any) -> list[float | None]:
    r"""Mathematical equivalence with the reference answer, checked with math-verify.

    The reference (``solution`` column) is parsed first; if it contains nothing
    math-verify can parse, the sample gets ``None`` (skipped, never rewarded). The
    completion's answer is the content of its last ``<answer>...</answer>`` block
    (LaTeX, ``\boxed{}``, or a plain number/expression); without such a block (or when
    the block holds nothing parsable), the whole completion is searched the way
    open-r1 does: ``\boxed{...}`` first, then LaTeX anchored by "answer"/"final answer
    is". Scores 1.0 when equivalent, else 0.0 (also when verification fails).
    LaTeX must be well formed, as in open-r1: ``\frac12`` is not parsed in answers.

    A GSM8K reference (its worked solution ending in ``#### 72``) is read as the number
    after ``####``, and a completion's ``#### 72`` line counts as its answer when it has no
    ``<answer>`` block.

    Example: with solution ``"\frac{1}{2}"``, ``"<answer>0.5</answer>"`` and
    ``"so the result is $\boxed{\frac{1}{2}}$"`` score 1.0, ``"<answer>2</answer>"``
    scores 0.0, and with solution ``"no idea"`` every completion scores None.
    """
    texts = contents(completions)
    refs = references("accuracy", solution, len(texts))
    return [None if ok is None else float(ok) for ok in correctness(texts, refs)]


def answer_match(
    completions: Sequence[Any], solution: Any = None, **kwargs: Any
) -> list[float | None]:
    """Exact string match of the last ``<answer>...</answer>`` block with the reference.

    Both sides are compared after stripping surrounding whitespace; the reference is
    converted with ``str()``. Scores 1.0 on a match, 0.0 otherwise (also when the
    completion has no answer block), and None when the reference is None.

    Example: with solution ``"42"``, ``"<think>\\n6*7\\n</think>\\n<answer> 42 </answer>"``
    scores 1.0, while ``"<answer>42.0</answer>"`` and ``"The answer is 42"`` score 0.0.
    """
    texts = contents(completions)
    refs = references("answer_match", solution, len(texts))
    out: list[float | None] = []
    for text, ref in zip(texts, refs, strict=True):
        if ref is None:
            out.append(None)
            continue
        block = last_answer_block(text)
        out.append(1.0 if block is not None and block.strip() == str(ref).strip() else 0.0)
    return out


# The GSM8K convention: the answer follows "#### " at the end of the solution.
_HASH_ANSWER_RE = re.compile(r"#### (-?[0-9.,]+)")
_HASH_TAIL = 300  # characters of the completion's end searched, as verl's gsm8k score


def gsm8k_answer(
    completions: Sequence[Any], solution: Any = None, **kwargs: Any
) -> list[float | None]:
    """1.0 when the last ``#### <number>`` of the completion's end equals the reference.

    GSM8K's own answer format, scored as verl's ``openai/gsm8k`` rule (strict): the number
    after the last ``#### `` in the completion's last 300 characters, commas and ``$`` removed,
    compared as a string with the reference (``str()``, stripped); 0.0 without one; None when
    the reference is None.

    Example: with solution ``"72"``, ``"48 + 24 = 72\\n#### 72"`` and ``"#### 7,2"`` score 1.0,
    ``"The answer is 72"`` and ``"#### 72.0"`` score 0.0.
    """
    texts = contents(completions)
    refs = references("gsm8k_answer", solution, len(texts))
    out: list[float | None] = []
    for text, ref in zip(texts, refs, strict=True):
        if ref is None:
            out.append(None)
            continue
        found = _HASH_ANSWER_RE.findall(text[-_HASH_TAIL:])
        answer = found[-1].replace(",", "").replace("$", "") if found else None
        out.append(1.0 if answer is not None and answer == str(ref).strip() else 0.0)
    return out


def format(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:  # noqa: A001
    """Strict ``<think>``/``<answer>`` layout, as open-r1's ``format_reward``.

    Scores 1.0 when the completion matches
    ``^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$`` (``re.DOTALL |
    re.MULTILINE``, matched from the start), else 0.0. Because of ``re.MULTILINE``,
    ``$`` also matches at the end of a line, so text on lines after ``</answer>`` is
    tolerated (open-r1 behaves the same).

    Example: ``"<think>\\n2+2\\n</think>\\n<answer>\\n4\\n</answer>"`` scores 1.0;
    ``"<think>2+2</think><answer>4</answer>"`` (no newlines) scores 0.0.
    """
    return [1.0 if _FORMAT_RE.match(text) else 0.0 for text in contents(completions)]


def _count_tags(text: str) -> float:
    score = 0.0
    for tag in ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>"):
        if text.count(tag) == 1:
            score += 0.25
    return score


def tag_count(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Partial credit for the tags of the ``format`` layout, as open-r1's ``tag_count_reward``.

    Adds 0.25 for each of ``"<think>\\n"``, ``"\\n</think>\\n"``, ``"\\n<answer>\\n"`` and
    ``"\\n</answer>"`` that occurs exactly once (0.0 to 1.0).

    Example: ``"<think>\\nhmm\\n</think>\\n<answer>\\n4\\n</answer>"`` scores 1.0;
    ``"<think>\\nhmm\\n</think>\\n4"`` scores 0.5.
    """
    return [_count_tags(text) for text in contents(completions)]


def length(completions: Sequence[Any], solution: Any = None, **kwargs: Any) -> list[float | None]:
    """Kimi 1.5 length reward (open-r1's ``len_reward``), relative to the other completions.

    Lengths are counted in characters, over the completions passed in one call
    (TRL passes the whole local batch). With ``min_len``/``max_len`` the shortest and
    longest of them, ``lambda = 0.5 - (len - min_len) / (max_len - min_len)``; a correct
    completion (same check as ``accuracy``) scores ``lambda``, a wrong one
    ``min(0, lambda)``. All lengths equal -> 0.0 for every sample. Samples whose
    reference does not parse score None and are left out of ``min_len``/``max_len``.

    Example: with solution ``"4"``, completions ``"<answer>4</answer>"`` (18 chars,
    correct), ``"<answer>5</answer>"`` (18, wrong) and ``"I think... <answer>4</answer>"``
    (29, correct) score 0.5, 0.0 and -0.5.
    """
    texts = contents(completions)
    refs = references("length", solution, len(texts))
    correct = correctness(texts, refs)
    lengths = [len(text) for text in texts]
    scored = [n for n, ok in zip(lengths, correct, strict=True) if ok is not None]
    if not scored:
        return [None] * len(texts)
    min_len, max_len = min(scored), max(scored)
    out: list[float | None] = []
    for n, ok in zip(lengths, correct, strict=True):
        if ok is None:
            out.append(None)
        elif max_len == min_len:
            out.append(0.0)
        else:
            lam = 0.5 - (n - min_len) / (max_len - min_len)
            out.append(float(lam if ok else min(0.0, lam)))
    return out


class SoftOverlongPunishment:
    """DAPO soft overlong punishment: a penalty that grows linearly near the length limit.

    Settings: ``overlong_max_length`` (``L``, default 1024) and ``overlong_buffer``
    (``B``, default 256). Length is the number of tokens when TRL passes
    ``completion_ids`` (it does during training), otherwise the number of characters
    of the completion text. Scores 0.0 when ``len <= L - B``, ``(L - B - len) / B``
    (between 0 and -1) when ``L - B < len <= L``, and -1.0 when ``len > L``.

    Example: with L=1024 and B=256, a 700-token completion scores 0.0, an 896-token one
    -0.5, a 1024-token one -1.0 and a 1100-token one -1.0.
    """

    __name__ = "soft_overlong_punishment"

    def __init__(self, max_length: int = 1024, buffer: int = 256) -> None:
        if buffer > max_length:
            raise RewardError(
                f"setting overlong_buffer={buffer} must not exceed overlong_max_length={max_length}"
            )
        self.max_length = max_length
        self.buffer = buffer

    def __repr__(self) -> str:
        return f"SoftOverlongPunishment(max_length={self.max_length}, buffer={self.buffer})"

    def __call__(
        self, completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any
    ) -> list[float | None]:
        if completion_ids is not None:
            lengths = [len(ids) for ids in completion_ids]
            if len(lengths) != len(completions):
                raise RewardError(
                    f"reward 'soft_overlong_punishment' got {len(completions)} completions "
                    f"but {len(lengths)} completion_ids"
                )
        else:
            lengths = [len(text) for text in contents(completions)]
        threshold = self.max_length - self.buffer
        out: list[float | None] = []
        for n in lengths:
            if n <= threshold:
                out.append(0.0)
            elif n <= self.max_length:
                out.append((threshold - n) / self.buffer)
            else:
                out.append(-1.0)
        return out


class RepetitionPenalty:
    """N-gram repetition penalty (open-r1's ``repetition_penalty_reward``, arXiv:2502.03373).

    Settings: ``repetition_n_grams`` (``n``, default 3) and ``repetition_max_penalty``
    (``P``, default -1.0, must be <= 0). The completion is lower-cased and split on
    whitespace into words; the score is ``(1 - unique_ngrams / total_ngrams) * P``:
    0.0 for text without repeated n-grams, approaching ``P`` for text that loops.
    Empty completions and completions shorter than ``n`` words score 0.0.

    Example: with n=3 and P=-1.0, ``"a b c a b c"`` has 4 trigrams of which 3 are
    unique and scores -0.25; ``"the cat sat"`` scores 0.0.
    """

    __name__ = "repetition_penalty"

    def __init__(self, n_grams: int = 3, max_penalty: float = -1.0) -> None:
        if max_penalty > 0:
            raise RewardError(f"setting repetition_max_penalty must be <= 0, got {max_penalty!r}")
        self.n_grams = n_grams
        self.max_penalty = max_penalty

    def __repr__(self) -> str:
        return f"RepetitionPenalty(n_grams={self.n_grams}, max_penalty={self.max_penalty})"

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = self.n_grams
        out: list[float | None] = []
        for text in contents(completions):
            words = text.lower().split()
            if len(words) < n:
                out.append(0.0)
                continue
            grams = list(zip(*(words[i:] for i in range(n)), strict=False))
            penalty = (1.0 - len(set(grams)) / len(grams)) * self.max_penalty
            out.append(penalty if penalty else 0.0)  # no "-0.0" in the logs
        return out


# open-r1's reasoning_steps pattern. Without re.MULTILINE, "^\d+\." only matches a numbered
# item at the very start of the completion; kept as is so that scores agree with open-r1.
_STEP_RE = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def reasoning_steps(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    r"""Step-by-step structure, as open-r1's ``reasoning_steps_reward``: ``min(1, markers / 3)``.

    Counts the markers ``Step N:``, a numbered item ``N.`` at the very start of the
    completion, a line starting with ``-`` or ``*``, and the words ``First,``,
    ``Second,``, ``Next,`` and ``Finally,``. Three or more markers score 1.0.

    Example: ``"Step 1: add. Step 2: carry. Step 3: done."`` scores 1.0;
    ``"First, add.\nFinally, done."`` scores 0.667 (2/3); ``"42"`` scores 0.0.
    """
    return [min(1.0, len(_STEP_RE.findall(text)) / 3) for text in contents(completions)]


class CosineScaled:
    """Length-scaled correctness, as open-r1's ``cosine`` reward (arXiv:2502.03373).

    Settings: ``cosine_min_value_wrong``, ``cosine_max_value_wrong``,
    ``cosine_min_value_correct``, ``cosine_max_value_correct`` (defaults 0.0, -0.5, 0.5,
    1.0, as in open-r1) and ``cosine_max_len`` (``L``, default 1000 characters).
    Correctness is checked as ``accuracy`` does. With ``t = min(len, L) / L`` (length in
    characters) and ``c = (1 + cos(pi * t)) / 2`` (1 at length 0, 0 at ``L``), a correct
    completion scores ``min_correct + (max_correct - min_correct) * c`` (short is best), a
    wrong one ``max_wrong + (min_wrong - max_wrong) * c``. A reference that does not parse
    gives None (open-r1 gives 1.0). Unlike open-r1, lengths past ``L`` score as ``L``
    (open-r1's cosine would rise again).

    Example: with the defaults and solution ``"4"``, ``"<answer>4</answer>"`` (18
    characters, correct) scores 0.9996, a wrong answer of the same length -0.0004, and a
    correct 1000-character completion 0.5.
    """

    __name__ = "cosine"

    def __init__(
        self,
        min_value_wrong: float = 0.0,
        max_value_wrong: float = -0.5,
        min_value_correct: float = 0.5,
        max_value_correct: float = 1.0,
        max_len: int = 1000,
    ) -> None:
        self.wrong = (min_value_wrong, max_value_wrong)
        self.correct = (min_value_correct, max_value_correct)
        self.max_len = max_len

    def __repr__(self) -> str:
        return f"CosineScaled(wrong={self.wrong}, correct={self.correct}, max_len={self.max_len})"

    def _scaled(self, length: int, ok: bool) -> float:
        c = (1.0 + math.cos(math.pi * min(length, self.max_len) / self.max_len)) / 2
        if ok:
            low, high = self.correct
            return low + (high - low) * c
        short, long = self.wrong  # min_value_wrong at length 0, max_value_wrong at L
        return long + (short - long) * c

    def __call__(
        self, completions: Sequence[Any], solution: Any = None, **kwargs: Any
    ) -> list[float | None]:
        texts = contents(completions)
        refs = references("cosine", solution, len(texts))
        return [
            None if ok is None else self._scaled(len(text), ok)
            for text, ok in zip(texts, correctness(texts, refs), strict=True)
        ]


def _boxed_answer(text: str) -> list[Any]:
    boxed = last_boxed(text)
    return [] if boxed is None else parse_answer(boxed)


def boxed_accuracy_math(
    completions: Sequence[Any], solution: Any = None, **kwargs: Any
) -> list[float | None]:
    r"""1.0 when the last ``\boxed{...}`` answer is equivalent to the reference (math-verify).

    Only the content of the completion's last ``\boxed{}`` (or ``\fbox{}``) with balanced
    braces counts: no ``<answer>`` block and no unboxed text. No boxed answer scores 0.0
    (pair it with ``boxed_missing_penalty`` to punish that); a reference that does not
    parse gives None, as in ``accuracy``.

    Example: with solution ``"\frac{1}{2}"``, ``"... so $\boxed{0.5}$"`` scores 1.0,
    ``"\boxed{1} no wait \boxed{2}"`` 0.0 (the last one counts) and ``"1/2"`` 0.0.
    """
    texts = contents(completions)
    refs = references("boxed_accuracy_math", solution, len(texts))
    return [
        None if ok is None else float(ok)
        for ok in correctness(texts, refs, answer_of=_boxed_answer)
    ]


def boxed_missing_penalty(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    r"""-1.0 for a completion without a ``\boxed{...}`` answer, 0.0 otherwise.

    The companion of ``boxed_accuracy_math``: an unclosed ``\boxed{`` (a completion cut
    at the length limit) counts as missing.

    Example: ``"so $\boxed{7}$"`` scores 0.0; ``"the answer is 7"`` and ``"\boxed{7"``
    score -1.0.
    """
    return [0.0 if last_boxed(text) is not None else -1.0 for text in contents(completions)]


def digit_fraction(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Fraction of the completion's non-space characters that are digits (0.0 to 1.0).

    A dense reward an untrained model can climb, for smoke runs and learning tests: a strict
    0/1 task reward is 0 everywhere for a random model, so nothing would be learned. An empty
    (or all-space) completion scores 0.0.

    Example: ``"12 + 34"`` scores 0.8 (4 digits of 5 characters); ``"none"`` scores 0.0.
    """
    out: list[float | None] = []
    for text in contents(completions):
        chars = [c for c in text if not c.isspace()]
        out.append(sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0)
    return out


def ascii_fraction(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Fraction of the completion's non-space characters that are printable ASCII (0.0 to 1.0).

    A language-consistency reward for English outputs, in the spirit of DeepSeek-R1's (it
    penalises mixed scripts and the replacement characters of undecodable bytes), and a dense
    reward that a random model's text varies in: about a third of the tiny model's tokens are
    single bytes above ASCII, so its completions spread where ``digit_fraction`` (10 digit
    tokens of 352) often gives every completion of a group 0. An empty (or all-space)
    completion scores 0.0.

    Example: ``"x = 2 ü"`` scores 0.75 (``x``, ``=`` and ``2`` of 4 characters);
    ``"��"`` (two undecodable bytes) scores 0.0 and ``"42"`` 1.0.
    """
    out: list[float | None] = []
    for text in contents(completions):
        chars = [c for c in text if not c.isspace()]
        out.append(sum("!" <= c <= "~" for c in chars) / len(chars) if chars else 0.0)
    return out


_WORD_RE = re.compile(r"\w+")


def keyword_match(
    completions: Sequence[Any], solution: Any = None, **kwargs: Any
) -> list[float | None]:
    """Share of the reference's keywords that the completion contains as whole words.

    The reference (``solution`` column) is one keyword or phrase, or several separated by
    commas (or a list); matching ignores case and punctuation around words, and a phrase must
    appear as its words in order. Scores from 0.0 to 1.0, None when the reference is None or
    has no words.

    Example: with solution ``"Paris"``, ``"It is paris."`` scores 1.0 and ``"Parisian"`` 0.0;
    with ``"red, green apple"``, ``"a green apple"`` scores 0.5.
    """
    texts = contents(completions)
    refs = references("keyword_match", solution, len(texts))
    out: list[float | None] = []
    for text, ref in zip(texts, refs, strict=True):
        keys = ref if isinstance(ref, (list, tuple)) else [] if ref is None else str(ref).split(",")
        phrases = [" ".join(_WORD_RE.findall(str(k).lower())) for k in keys]
        phrases = [p for p in phrases if p]
        if not phrases:
            out.append(None)
            continue
        words = f" {' '.join(_WORD_RE.findall(text.lower()))} "
        out.append(sum(f" {p} " in words for p in phrases) / len(phrases))
    return out

"""Reward functions for GRPO training, and the registry that resolves them by name.

Every reward is a plain callable following TRL's convention::

    reward(completions, **kwargs) -> list[float | None]

``completions`` holds either strings or conversational message lists
(``[{"role": "assistant", "content": "..."}]``, in which case the content of the
last message is scored). The reference answer arrives as the ``solution`` keyword
(one entry per completion; TRL forwards every dataset column as a keyword).
Any other keyword TRL passes (``prompts``, ``completion_ids``, ``trainer_state``,
``log_extra``, ``log_metric``, dataset columns) is accepted and ignored unless a
reward documents that it uses it. ``None`` means "no reward for this sample"; TRL
turns it into NaN and leaves it out of the weighted sum.

Rewards are resolved with :func:`get_reward_funcs`, either by registry name
(see :func:`list_reward_names`) or as ``module:function`` for a custom callable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from maxent_grpo.errors import UserError

__all__ = [
    "REWARD_SETTINGS",
    "GuardedReward",
    "RepetitionPenalty",
    "RewardError",
    "RewardFunc",
    "SoftOverlongPunishment",
    "get_reward_funcs",
    "guard_rewards",
    "list_reward_names",
]

RewardFunc = Callable[..., list[float | None]]


class RewardError(UserError):
    """A reward name, ``module:function`` spec, setting or input that cannot be used."""


#: Settings understood by the parametrised built-in rewards, with their defaults.
REWARD_SETTINGS: dict[str, int | float] = {
    "overlong_max_length": 1024,
    "overlong_buffer": 256,
    "repetition_n_grams": 3,
    "repetition_max_penalty": -1.0,
}

# --------------------------------------------------------------------------------------
# Regexes and math-verify configurations (built once, at import time)
# --------------------------------------------------------------------------------------

# Content of an <answer> block that contains no nested "<answer>" opening tag, so that
# "<answer>1<answer>2</answer>" yields "2" rather than "1<answer>2".
_ANSWER_BLOCK_RE = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)
# open-r1's format_reward pattern, with the same flags.
_FORMAT_RE = re.compile(
    r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE
)
# A short answer written without math delimiters is wrapped in "$...$" before parsing
# when it contains one of these characters (LaTeX commands, powers, groups, intervals).
_BARE_LATEX_RE = re.compile(r"[\\^_{}()\[\]]")
_MATH_DELIMITER_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\n")
# ... unless it reads like prose (a word of 3+ letters that is not a LaTeX command),
# which "$...$" would turn into a product of symbols that can never match.
_PROSE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")

# open-r1's answer normalisation: the answer must be well-formed LaTeX (no "nits",
# no malformed operators); boxed answers are tried first. ``equations=True`` (as in
# open-r1) is deprecated in latex2sympy2_extended >= 1.10, where it does nothing except
# log a warning on every call, so it is left at False: the parsing is identical.
_ANSWER_NORMALIZATION = NormalizationConfig(
    nits=False,
    malformed_operators=False,
    basic_latex=True,
    equations=False,
    boxed="all",
    units=True,
)
# Whole completion: LaTeX needs an anchor ("answer ... $x$", "final answer is", \boxed).
_COMPLETION_CONFIGS = (
    LatexExtractionConfig(
        normalization_config=_ANSWER_NORMALIZATION,
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    ),
)
# Content of an <answer> block: it *is* the answer, so no anchor is needed, and plain
# numbers/expressions ("42", "1/2") are accepted as well.
_ANSWER_BLOCK_CONFIGS = (
    dataclasses.replace(_COMPLETION_CONFIGS[0], try_extract_without_anchor=True),
    ExprExtractionConfig(),
)
# Reference answers: math-verify's defaults (as open-r1), plus plain numbers.
_GOLD_CONFIGS = (LatexExtractionConfig(), ExprExtractionConfig())


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal content parts
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def _completion_text(completion: Any) -> str:
    """Text of one completion: a string, or the content of the last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        if not completion:
            return ""
        last = completion[-1]
        if isinstance(last, Mapping):
            return _content_text(last.get("content"))
        return _content_text(last)
    if completion is None:
        return ""
    return str(completion)


def _texts(completions: Sequence[Any]) -> list[str]:
    return [_completion_text(c) for c in completions]


def _references(name: str, solution: Any, count: int) -> list[Any]:
    if solution is None:
        raise RewardError(
            f"reward {name!r} needs the reference answers as the 'solution' keyword "
            "(a 'solution' column in the dataset)"
        )
    if isinstance(solution, (str, bytes)) or not isinstance(solution, Sequence):
        raise RewardError(
            f"reward {name!r} needs 'solution' as a list aligned with the completions, "
            f"got {type(solution).__name__}"
        )
    if len(solution) != count:
        raise RewardError(f"reward {name!r} got {count} completions but {len(solution)} solutions")
    return list(solution)


def _last_answer_block(text: str) -> str | None:
    blocks = _ANSWER_BLOCK_RE.findall(text)
    return blocks[-1] if blocks else None


def _parse(text: str, configs: Sequence[Any]) -> list[Any]:
    # parsing_timeout=None: math-verify's timeout uses signal.alarm, which raises
    # outside the main thread (TRL may score rewards from worker threads).
    return parse(
        text,
        extraction_config=configs,
        extraction_mode="first_match",
        parsing_timeout=None,
    )


def _parse_short(text: str, configs: Sequence[Any]) -> list[Any]:
    """Parse a short answer that may be bare LaTeX without delimiters.

    math-verify only finds LaTeX between delimiters, so ``2\\sqrt{2}`` would parse as
    ``2`` and ``(1, 2)`` as ``2``. A single line with LaTeX-ish characters, no
    delimiters and no prose is therefore wrapped in ``$...$`` first.
    """
    text = text.strip()
    if not text:
        return []
    if (
        _BARE_LATEX_RE.search(text)
        and not _MATH_DELIMITER_RE.search(text)
        and not _PROSE_WORD_RE.search(text)
    ):
        wrapped = _parse(f"${text}$", configs)
        if wrapped:
            return wrapped
    return _parse(text, configs)


def _parse_gold(solution: Any) -> list[Any]:
    if solution is None:
        return []
    return _parse_short(str(solution), _GOLD_CONFIGS)


def _parse_completion(text: str) -> list[Any]:
    block = _last_answer_block(text)
    if block is not None:
        parsed = _parse_short(block, _ANSWER_BLOCK_CONFIGS)
        if parsed:
            return parsed
    return _parse(text, _COMPLETION_CONFIGS)


def _verify(gold: list[Any], answer: list[Any]) -> bool:
    if not answer:
        return False
    try:
        return bool(verify(gold, answer, timeout_seconds=None))
    except Exception:  # any failure inside sympy counts as "wrong"
        return False


def _correctness(texts: Sequence[str], references: Sequence[Any]) -> list[bool | None]:
    """True/False per completion, None where the reference does not parse."""
    gold_cache: dict[str, list[Any]] = {}  # one gold is shared by a whole group
    out: list[bool | None] = []
    for text, ref in zip(texts, references, strict=True):
        if ref is None:
            out.append(None)
            continue
        key = str(ref)
        if key not in gold_cache:
            gold_cache[key] = _parse_gold(key)
        gold = gold_cache[key]
        out.append(None if not gold else _verify(gold, _parse_completion(text)))
    return out


# --------------------------------------------------------------------------------------
# Built-in rewards
#
# They are module-level functions named after their registry names, or instances of
# module-level classes for the parametrised ones, so that they pickle (TRL's async GRPO
# rollout worker sends reward functions to a spawned process; closures do not pickle)
# and TRL logs them under ``rewards/<name>/mean`` (it uses ``__name__``).
# --------------------------------------------------------------------------------------


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

    Example: with solution ``"\frac{1}{2}"``, ``"<answer>0.5</answer>"`` and
    ``"so the result is $\boxed{\frac{1}{2}}$"`` score 1.0, ``"<answer>2</answer>"``
    scores 0.0, and with solution ``"no idea"`` every completion scores None.
    """
    texts = _texts(completions)
    refs = _references("accuracy", solution, len(texts))
    return [None if ok is None else float(ok) for ok in _correctness(texts, refs)]


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
    texts = _texts(completions)
    refs = _references("answer_match", solution, len(texts))
    out: list[float | None] = []
    for text, ref in zip(texts, refs, strict=True):
        if ref is None:
            out.append(None)
            continue
        block = _last_answer_block(text)
        out.append(1.0 if block is not None and block.strip() == str(ref).strip() else 0.0)
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
    return [1.0 if _FORMAT_RE.match(text) else 0.0 for text in _texts(completions)]


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
    return [_count_tags(text) for text in _texts(completions)]


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
    texts = _texts(completions)
    refs = _references("length", solution, len(texts))
    correct = _correctness(texts, refs)
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
            lengths = [len(text) for text in _texts(completions)]
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
        for text in _texts(completions):
            words = text.lower().split()
            if len(words) < n:
                out.append(0.0)
                continue
            grams = list(zip(*(words[i:] for i in range(n)), strict=False))
            penalty = (1.0 - len(set(grams)) / len(grams)) * self.max_penalty
            out.append(penalty if penalty else 0.0)  # no "-0.0" in the logs
        return out


# Registry: name -> builder taking the resolved settings.
_REGISTRY: dict[str, Callable[[Mapping[str, Any]], RewardFunc]] = {
    "accuracy": lambda s: accuracy,
    "answer_match": lambda s: answer_match,
    "format": lambda s: format,
    "tag_count": lambda s: tag_count,
    "length": lambda s: length,
    "soft_overlong_punishment": lambda s: SoftOverlongPunishment(
        s["overlong_max_length"], s["overlong_buffer"]
    ),
    "repetition_penalty": lambda s: RepetitionPenalty(
        s["repetition_n_grams"], s["repetition_max_penalty"]
    ),
}


# --------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------


def _as_int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RewardError(f"setting {key} must be an integer >= {minimum}, got {value!r}")
    return value


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardError(f"setting {key} must be a finite number, got {value!r}")
    return float(value)


def _resolve_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(settings) - set(REWARD_SETTINGS))
    if unknown:
        raise RewardError(
            f"unknown reward setting(s) {', '.join(unknown)}; "
            f"valid settings: {', '.join(sorted(REWARD_SETTINGS))}"
        )
    resolved = {**REWARD_SETTINGS, **settings}
    resolved["overlong_max_length"] = _as_int(
        "overlong_max_length", resolved["overlong_max_length"], 1
    )
    resolved["overlong_buffer"] = _as_int("overlong_buffer", resolved["overlong_buffer"], 1)
    resolved["repetition_n_grams"] = _as_int(
        "repetition_n_grams", resolved["repetition_n_grams"], 1
    )
    penalty = _as_float("repetition_max_penalty", resolved["repetition_max_penalty"])
    if penalty > 0:
        raise RewardError(f"setting repetition_max_penalty must be <= 0, got {penalty!r}")
    resolved["repetition_max_penalty"] = penalty
    return resolved


# --------------------------------------------------------------------------------------
# Custom rewards: "module:function"
# --------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ModuleNotFoundError(f"No such file '{path}'")
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{path}'")
    module = importlib.util.module_from_spec(spec)
    registered = sys.modules.setdefault(name, module) is module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if registered:
            del sys.modules[name]
        raise
    return module


def _import_module(module_name: str) -> ModuleType:
    if module_name.endswith(".py") or os.sep in module_name:
        return _import_file(Path(module_name))
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Entry-point scripts do not put the working directory on sys.path; let
        # "my_rewards:fn" find ./my_rewards.py all the same.
        cwd = os.getcwd()
        top = module_name.split(".")[0]
        on_path = {os.path.abspath(p or os.curdir) for p in sys.path}
        if exc.name != top or cwd in on_path:
            raise
        sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as retry_exc:
            if retry_exc.name == top:
                raise exc from None
            raise
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def _load_custom(spec: str) -> RewardFunc:
    module_name, _, attr = spec.rpartition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise RewardError(f"invalid reward spec {spec!r}: expected 'module:function'")
    try:
        module = _import_module(module_name)
    except Exception as exc:  # any import-time failure is reported
        raise RewardError(f"cannot load reward {spec!r}: {_one_line(exc)}") from exc
    obj: Any = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise RewardError(f"cannot load reward {spec!r}: {_one_line(exc)}") from exc
    if not callable(obj):
        raise RewardError(
            f"cannot load reward {spec!r}: TypeError: {attr!r} in module {module_name!r} "
            f"is not callable (got {type(obj).__name__})"
        )
    return obj


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def list_reward_names() -> list[str]:
    """Names of the built-in rewards, sorted."""
    return sorted(_REGISTRY)


def get_reward_funcs(names: Sequence[str], **settings: Any) -> list[RewardFunc]:
    """Resolve reward names into TRL reward callables, in the given order.

    Each name is either a built-in (see :func:`list_reward_names`) or a
    ``module:function`` spec: the module is imported (a module on ``sys.path``, in
    the working directory, or a ``path/to/file.py``) and the attribute returned
    as is. ``settings`` override :data:`REWARD_SETTINGS` for the parametrised
    built-ins (``soft_overlong_punishment``, ``repetition_penalty``).

    Raises:
        RewardError: an unknown name, a spec that cannot be loaded, or an unknown
            or invalid setting. The message is a single line.
    """
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise RewardError(f"reward names must be a list of strings, got {names!r}")
    resolved = _resolve_settings(settings)
    funcs: list[RewardFunc] = []
    for raw in names:
        if not isinstance(raw, str):
            raise RewardError(f"reward names must be strings, got {raw!r}")
        name = raw.strip()
        if name in _REGISTRY:
            funcs.append(_REGISTRY[name](resolved))
        elif ":" in name:
            funcs.append(_load_custom(name))
        else:
            raise RewardError(
                f"unknown reward {raw!r}; valid names: {', '.join(list_reward_names())} "
                "(or 'module:function' for a custom reward)"
            )
    return funcs


# --- Failure policy --------------------------------------------------------------------------
#
# A reward function that raises or hangs on one odd sample must not end a 30-hour run, and
# must not silently score it 0 either. Policy: the batch is retried one sample at a time; the
# samples that still fail (or exceed the time limit) score None, which TRL skips (NaN-aware
# mean), are counted in the `rewards/<name>/failures` metric, and are logged with their index.


class RewardTimeout(Exception):
    """A reward call ran past reward_timeout_seconds."""


def _call_with_timeout(func: RewardFunc, timeout: float | None, completions, **kwargs):
    import signal
    import threading

    # SIGALRM only works on the main thread (where TRL scores rewards); elsewhere: no limit.
    if not timeout or threading.current_thread() is not threading.main_thread():
        return func(completions, **kwargs)

    def on_alarm(_signum, _frame):
        raise RewardTimeout(f"no result after {timeout:g}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return func(completions, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class GuardedReward:
    """A reward function with the failure policy above; keeps the wrapped one's __name__."""

    def __init__(self, func: RewardFunc, timeout: float | None):
        self.func = func
        self.timeout = timeout
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, completions, **kwargs):
        try:
            scores = _call_with_timeout(self.func, self.timeout, completions, **kwargs)
            failures = 0
        except Exception as exc:  # noqa: BLE001 - any failure of user code is handled alike
            _logger().warning(
                "reward %s failed on a batch (%s: %s); retrying sample by sample",
                self.__name__,
                type(exc).__name__,
                exc,
            )
            scores, failures = self._per_sample(completions, kwargs)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"rewards/{self.__name__}/failures", float(failures))
        return scores

    def _per_sample(self, completions, kwargs) -> tuple[list[float | None], int]:
        n = len(completions)
        scores: list[float | None] = []
        failures = 0
        for i in range(n):
            # Per-sample view of every per-sample keyword (solution, prompts, columns...).
            sample = {
                k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()
            }
            sample.pop("log_metric", None)
            try:
                scores.append(
                    _call_with_timeout(self.func, self.timeout, [completions[i]], **sample)[0]
                )
            except Exception as exc:  # noqa: BLE001
                failures += 1
                scores.append(None)
                _logger().warning(
                    "reward %s: sample %d scored None (%s: %s)",
                    self.__name__,
                    i,
                    type(exc).__name__,
                    exc,
                )
        return scores, failures


def _logger():
    import logging

    return logging.getLogger("maxent_grpo.rewards")


def guard_rewards(funcs: list[RewardFunc], timeout: float | None) -> list[RewardFunc]:
    """Apply the failure policy to every reward function."""
    return [GuardedReward(func, timeout) for func in funcs]

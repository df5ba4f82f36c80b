"""Finding and verifying math answers: <answer> blocks, \\boxed{} answers and math-verify.

The regexes and math-verify configurations are built once, at import time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, grader, parse, verify
from math_verify import parser as math_verify_parser

# Its signal-based timeouts are off here (see _parse); the reward guard (rewards/guard.py)
# bounds a reward's time instead, so math-verify's "Timeout is disabled" warning, printed
# once per process (every eval and trainer process), says nothing a user can act on.
math_verify_parser.TIMEOUT_WARNING_SHOWN = True
grader.TIMEOUT_WARNING_SHOWN = True

# Content of an <answer> block that contains no nested "<answer>" opening tag, so that
# "<answer>1<answer>2</answer>" yields "2" rather than "1<answer>2".
_ANSWER_BLOCK_RE = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)
# A short answer written without math delimiters is wrapped in "$...$" before parsing
# when it contains one of these characters (LaTeX commands, powers, groups, intervals).
_BARE_LATEX_RE = re.compile(r"[\\^_{}()\[\]]")
_MATH_DELIMITER_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\n")
# ... unless it reads like prose (a word of 3+ letters that is not a LaTeX command),
# which "$...$" would turn into a product of symbols that can never match.
_PROSE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
# GSM8K's final answer: the rest of the last line that starts with "####" ("#### 1,250").
_GSM8K_RE = re.compile(r"^[ \t]*####[ \t]*(.+?)[ \t]*$", re.MULTILINE)
# "\boxed{" or "\boxed {" (also \fbox); the content is found by brace matching.
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")

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
# Content of an <answer> block or of a \boxed{}: it *is* the answer, so no anchor is
# needed, and plain numbers/expressions ("42", "1/2") are accepted as well.
_ANSWER_BLOCK_CONFIGS = (
    dataclasses.replace(_COMPLETION_CONFIGS[0], try_extract_without_anchor=True),
    ExprExtractionConfig(),
)
# Reference answers: math-verify's defaults (as open-r1), plus plain numbers.
_GOLD_CONFIGS = (LatexExtractionConfig(), ExprExtractionConfig())


def last_answer_block(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` block, or None."""
    blocks = _ANSWER_BLOCK_RE.findall(text)
    return blocks[-1] if blocks else None


def gsm8k_answer(text: str) -> str | None:
    """GSM8K's final answer (after the last ``####``), thousands separators dropped, or None.

    Example: the text ``"48/2 = 24 ..."`` followed by the line ``"#### 1,024"`` gives ``"1024"``.
    """
    found = _GSM8K_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) with balanced braces, or None.

    An unclosed ``\boxed{`` (a completion cut at the length limit) does not count.
    """
    for match in reversed(list(_BOXED_RE.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


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


def parse_gold(solution: Any) -> list[Any]:
    """The reference answer as math-verify sees it ([] when it does not parse)."""
    if solution is None:
        return []
    text = str(solution)
    # A GSM8K answer column holds the worked solution; its number is after "####".
    final = gsm8k_answer(text)
    return _parse_short(text if final is None else final, _GOLD_CONFIGS)


def parse_answer(text: str) -> list[Any]:
    """A short answer on its own (an <answer> block's or a \\boxed{}'s content)."""
    return _parse_short(text, _ANSWER_BLOCK_CONFIGS)


def parse_completion(text: str) -> list[Any]:
    """The answer of a whole completion: its last <answer> block, else a GSM8K-style
    ``#### answer`` line, else open-r1's search."""
    for block in (last_answer_block(text), gsm8k_answer(text)):
        if block is not None:
            parsed = parse_answer(block)
            if parsed:
                return parsed
    return _parse(text, _COMPLETION_CONFIGS)


def verified(gold: list[Any], answer: list[Any]) -> bool:
    """math-verify's equivalence; any failure inside sympy counts as "not equivalent"."""
    if not answer:
        return False
    try:
        return bool(verify(gold, answer, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - sympy raises assorted types on odd input
        return False


def correctness(
    texts: Sequence[str], references: Sequence[Any], answer_of=parse_completion
) -> list[bool | None]:
    """True/False per completion, None where the reference does not parse.

    ``answer_of`` extracts the parsed answer of one completion text.
    """
    gold_cache: dict[str, list[Any]] = {}  # one gold is shared by a whole group
    out: list[bool | None] = []
    for text, ref in zip(texts, references, strict=True):
        if ref is None:
            out.append(None)
            continue
        key = str(ref)
        if key not in gold_cache:
            gold_cache[key] = parse_gold(key)
        gold = gold_cache[key]
        out.append(None if not gold else verified(gold, answer_of(text)))
    return out

"""Multiple choice (MedQA, GPQA): map the answer to exactly one option, by letter or by option text.

An answer that names no option, or several, is wrong; nothing defaults to "A". When option texts contain one
another ("cancer" and "colorectal cancer"), a mention of the longer one is not also a mention of the shorter.
"""

from __future__ import annotations

import re
import string
from typing import Any

from agentflow.scoring.base import Score, binary, register_scorer
from agentflow.scoring.extract import extract_answer
from agentflow.scoring.qa import normalize_answer

_LETTER_PREFIX = re.compile(r"^\s*\(?([A-Z])[).:]\s*(?=\S)")
_LETTER_ONLY = re.compile(r"^[\s*_\[(]*([A-Z])[\s*_\]).:]*$")
# "answer is C.", "Answer: (C)", "answer is: C", "option C" - the letter must end there or be bracketed, so that
# "the answer is A patient ..." does not read as option A.
_LETTER_PHRASE = re.compile(
    r"(?i:\b(?:answer|option|choice)\b)\s*(?:(?i:is|would be)\s*)?:?\s*(?:(?i:option|choice)\s*)?"
    r"(?:\(([A-Z])\)|\b([A-Z])(?=\s*(?:$|[).:,;*])))"
)
_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[).:]\s+(.*)$", re.DOTALL)


def normalize_options(options: Any) -> dict[str, str]:
    """Options as {letter: text}: from a dict, from ["A. text", ...], or from plain texts (lettered A, B, ...)."""
    if isinstance(options, dict):
        return {str(k).strip().upper(): str(v) for k, v in options.items()}
    if not isinstance(options, (list, tuple)) or not options:
        raise ValueError(f"multiple-choice options must be a dict or a non-empty list, got {options!r}")
    lettered = [_OPTION_LINE.match(str(o)) for o in options]
    if all(lettered):
        result = {m.group(1): m.group(2).strip() for m in lettered if m}
        if len(result) == len(options):
            return result
    return {string.ascii_uppercase[i]: str(o) for i, o in enumerate(options)}


def gold_letter(options: dict[str, str], answer: Any) -> str:
    """The right option's letter from a letter, an option text, or a 0-based index."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        letters = list(options)
        if not 0 <= answer < len(letters):
            raise ValueError(f"answer index {answer} out of range for {len(letters)} options")
        return letters[answer]
    text = str(answer).strip()
    if text.upper() in options and len(text) == 1:
        return text.upper()
    wanted = normalize_answer(text)
    matches = [k for k, v in options.items() if normalize_answer(v) == wanted]
    if len(matches) != 1:
        raise ValueError(f"gold answer {text!r} matches {len(matches)} options of {options!r}")
    return matches[0]


def _explicit_letters(answer: str, options: dict[str, str]) -> set[str]:
    found: set[str] = set()
    only = _LETTER_ONLY.match(answer)
    if only:
        found.add(only.group(1))
    words = re.findall(r"[A-Za-z]+", answer)
    if words and all(w in ("or", "and") or (len(w) == 1 and w.isupper()) for w in words):
        found.update(w for w in words if len(w) == 1)  # "C or D", "B, C": a list of letters, not one answer
    prefix = _LETTER_PREFIX.match(answer)
    if prefix:
        found.add(prefix.group(1))
    for match in _LETTER_PHRASE.finditer(answer):
        found.add(match.group(1) or match.group(2))
    return {letter for letter in found if letter in options}


def _spans(haystack: str, needle: str) -> list[tuple[int, int]]:
    spans, start = [], haystack.find(needle)
    while start != -1:
        spans.append((start, start + len(needle)))
        start = haystack.find(needle, start + 1)
    return spans


def _text_matches(answer: str, options: dict[str, str]) -> tuple[str | None, set[str]]:
    """(option whose whole text is the answer, options mentioned in the answer on their own)."""
    prefix = _LETTER_PREFIX.match(answer)
    body = answer[prefix.end():] if prefix else answer
    norm_answer = normalize_answer(body)
    norm_options = {k: normalize_answer(v) for k, v in options.items()}
    exact = [k for k, v in norm_options.items() if v and v == norm_answer]
    if len(exact) == 1:
        return exact[0], set(exact)
    padded = f" {norm_answer} "
    spans = {k: _spans(padded, f" {v} ") for k, v in norm_options.items() if v}
    spans = {k: s for k, s in spans.items() if s}
    mentioned = set()
    for letter, own in spans.items():
        longer = [s for other, ss in spans.items() if other != letter
                  and len(norm_options[other]) > len(norm_options[letter]) for s in ss]
        # Mentioned on its own: at least one occurrence not inside a mention of a longer option.
        if any(not any(lo <= start and end <= hi for lo, hi in longer) for start, end in own):
            mentioned.add(letter)
    return None, mentioned


@register_scorer("multiple_choice", gold="multiple_choice",
                 description="Multiple choice: one option by letter or text; none or several is wrong.")
def multiple_choice(prediction: str, gold: Any) -> Score:
    """Multiple choice (gold: {"options": {letter: text} or ["A. text", ...], "answer": letter/text/index})."""
    if not isinstance(gold, dict) or "options" not in gold or "answer" not in gold:
        raise ValueError(f"multiple-choice gold must be {{'options': ..., 'answer': ...}}, got {gold!r}")
    options = normalize_options(gold["options"])
    right = gold_letter(options, gold["answer"])
    answer = extract_answer(prediction)
    letters = _explicit_letters(answer, options)
    exact, mentioned = _text_matches(answer, options)
    details: dict[str, Any] = {"extracted": answer, "gold": right, "letters": sorted(letters),
                               "text_matches": sorted(mentioned)}
    chosen: str | None = None
    if len(letters) > 1:
        details["reason"] = "several option letters"
    elif len(letters) == 1:
        letter = next(iter(letters))
        if mentioned and letter not in mentioned:
            details["reason"] = "the letter and the option text disagree"
        else:
            chosen, details["method"] = letter, "letter"
    elif exact:
        chosen, details["method"] = exact, "exact_text"
    elif len(mentioned) == 1:
        chosen, details["method"] = next(iter(mentioned)), "text"
    else:
        details["reason"] = "matches several options" if mentioned else "matches no option"
    details["chosen"] = chosen
    return binary(chosen == right, **details)

"""Game of 24: check the expression itself, never compare it as text with one reference solution.

The expression is parsed with Python's `ast` (nothing is evaluated): only integer literals, + - * / and
parentheses are allowed, the literals must be exactly the puzzle's numbers (as a multiset), and the value is
computed with exact fractions, so 8 / (3 - 8/3) counts and a division by zero is simply wrong.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from agentflow.scoring.base import Score, binary, register_scorer
from agentflow.scoring.extract import extract_answer

TARGET = 24
MAX_CHARS = 200
_TOO_LONG = "expression too long"
_NOT_AN_EXPRESSION = "not a valid arithmetic expression"

_SYMBOLS = {
    "×": "*", "✕": "*", "⋅": "*", "·": "*", "∗": "*", "\\times": "*", "\\cdot": "*",
    "÷": "/", "\\div": "/", "∕": "/",
    "−": "-", "–": "-", "—": "-",
    "\\left": "", "\\right": "", "[": "(", "]": ")", "{": "(", "}": ")", "$": "", "\\(": "", "\\)": "",
}
_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
              ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
# Runs of characters an arithmetic expression is made of ("=" excluded): the expression inside a sentence.
_EXPRESSION_RUN = re.compile(r"[\d\s+\-*/().]+")


class _Rejected(Exception):
    """The expression breaks a rule of the game."""


def puzzle_numbers(gold: Any) -> list[int]:
    """The four numbers of a puzzle: a list, or a string like "[1, 1, 1, 8]" or "1 1 1 8"."""
    if isinstance(gold, dict):
        gold = gold.get("numbers")
    if isinstance(gold, str):
        gold = re.findall(r"-?\d+", gold)
    if not isinstance(gold, (list, tuple)) or not gold:
        raise ValueError(f"Game of 24 gold must be the puzzle's numbers, got {gold!r}")
    return [int(n) for n in gold]


def _canonical(text: str) -> str:
    for symbol, replacement in _SYMBOLS.items():
        text = text.replace(symbol, replacement)
    return text.strip().rstrip(".")


def _drop_target(text: str) -> str:
    """"(1+1+1)*8 = 24" and "24 = 8*3*1*1" become the expression alone; a side that is not 24 is kept."""
    if "=" not in text:
        return text
    sides = [s.strip() for s in text.split("=")]
    rest = [s for s in sides if s != str(TARGET)]
    if len(rest) != 1:
        raise _Rejected("the answer has several '=' sides")
    return rest[0]


def _evaluate(node: ast.AST, literals: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, literals)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left = _evaluate(node.left, literals)
        right = _evaluate(node.right, literals)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Rejected("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.Constant):
        raise _Rejected(f"only whole numbers are allowed, found {node.value!r}")
    if isinstance(node, ast.UnaryOp):
        raise _Rejected("unary operators are not allowed")
    if isinstance(node, ast.BinOp):
        raise _Rejected(f"operator {type(node.op).__name__} is not allowed (only + - * /)")
    raise _Rejected(f"{type(node).__name__} is not allowed in the expression")


def check_expression(expression: str, numbers: list[int]) -> tuple[bool, str]:
    """Whether `expression` makes 24 from `numbers`, each used exactly once; with the reason when not."""
    if len(expression) > MAX_CHARS:
        return False, _TOO_LONG
    try:
        tree = ast.parse(_drop_target(_canonical(expression)), mode="eval")
    except SyntaxError:
        return False, _NOT_AN_EXPRESSION
    except _Rejected as err:
        return False, str(err)
    literals: list[int] = []
    try:
        value = _evaluate(tree, literals)
    except _Rejected as err:
        return False, str(err)
    if Counter(literals) != Counter(numbers):
        return False, f"uses {sorted(literals)}, the puzzle gives {sorted(numbers)} (each exactly once)"
    if value != TARGET:
        return False, f"evaluates to {value}, not {TARGET}"
    return True, "ok"


def _candidates(answer: str) -> list[str]:
    """The answer as a whole, then (for answers written as a sentence) its last arithmetic run."""
    runs = [m.group().strip().rstrip(".").strip() for m in _EXPRESSION_RUN.finditer(_canonical(answer))]
    runs = [r for r in runs if any(op in r for op in "+-*/") and any(ch.isdigit() for ch in r)]
    return [answer] + runs[-1:]


@register_scorer("gameof24", gold="gameof24",
                 description="Game of 24: safe AST check, each number once, exact arithmetic == 24.")
def game_of_24(prediction: str, gold: Any) -> Score:
    """Game of 24 (gold: the puzzle's numbers): correct when the expression in the answer makes 24 by the rules."""
    numbers = puzzle_numbers(gold)
    answer = extract_answer(prediction)
    if not answer:
        return binary(False, extracted="", reason="empty answer", numbers=numbers)
    reason = ""
    candidates = _candidates(answer)
    for candidate in candidates:
        ok, reason = check_expression(candidate, numbers)
        if ok:
            return binary(True, extracted=answer, expression=candidate, numbers=numbers)
    if len(candidates) == 1 and reason in (_NOT_AN_EXPRESSION, _TOO_LONG) \
            and any(ch.isalpha() for ch in _canonical(answer)):
        reason = "no arithmetic expression in the answer"  # prose, not a malformed expression
    # The reason given is that of the last candidate: the expression found inside a sentence, when there is one.
    return binary(False, extracted=answer, expression=candidate, reason=reason, numbers=numbers)

"""The calculator demo: one tool, a reward, and the prompts.

`calculator` evaluates + - * / ( ) on numbers safely (no eval). `correct_answer`
rewards a conversation whose final assistant text contains the right number.
"""

from __future__ import annotations

import ast
import operator
import random
import re

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only numbers and + - * / ( ) are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: An expression with numbers and + - * / ( ), e.g. "12 * (3 + 4)".
    """
    value = _eval(ast.parse(expression, mode="eval"))
    return str(int(value) if float(value).is_integer() else round(value, 6))


def _last_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    texts = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    return texts[-1] if texts else ""


def correct_answer(completions, answer, **kwargs):
    """1.0 when the last assistant turn contains the expected number, else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        nums = re.findall(r"-?\d+(?:\.\d+)?", _last_text(c))
        out.append(1.0 if str(a) in nums else 0.0)
    return out


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Arithmetic prompts with their answers."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(2, 99), rng.randint(2, 99), rng.choice("+-*")
        expr = f"{a} {op} {b}"
        rows.append({"prompt": [{"role": "user", "content": f"What is {expr}? Use the calculator."}],
                     "answer": calculator(expr), "expression": expr})
    return rows

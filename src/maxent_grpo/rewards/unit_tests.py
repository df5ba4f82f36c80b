"""The trainer's side of ``python_unit_tests``: rewritten tests out, the verdict computed here.

:func:`prepare` splits the row's tests into top-level statements and rewrites every ``assert``
into ``__maxent_check__(ops, operand, ...)``: the operands of a comparison (``a == b``,
``x in y``, chains too) or the asserted value; inside them, the operands of nested comparisons
and arithmetic and the object of a method called on a result pass ``__maxent_plain__``, which
stops the statement unless they are plain data. :func:`verdict` reads what the runner
(:mod:`maxent_grpo.rewards.unit_child`) sent back: every statement must have its ``done``
record and every check must hold when evaluated here, on the operands rebuilt from their
``repr`` with ``ast.literal_eval``; the program's own ``__eq__`` or ``__bool__`` never decides.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import secrets
from pathlib import Path
from typing import Any

RUNNER = (Path(__file__).parent / "unit_child.py").read_text(encoding="utf-8")

_OPS = {
    "Eq": operator.eq,
    "NotEq": operator.ne,
    "Lt": operator.lt,
    "LtE": operator.le,
    "Gt": operator.gt,
    "GtE": operator.ge,
    "In": lambda a, b: a in b,
    "NotIn": lambda a, b: a not in b,
    "Is": operator.is_,
    "IsNot": operator.is_not,
}


def _plain_checked(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Constant):
        return node
    call = ast.Call(func=ast.Name(id="__maxent_plain__", ctx=ast.Load()), args=[node], keywords=[])
    return ast.copy_location(call, node)


class _Nested(ast.NodeTransformer):
    """Inside an assert's operands: the values that meet the test's own values (the operands of
    nested comparisons and arithmetic, the object of a method called on a result) must be
    plain data, so that an object's ``__sub__`` or ``startswith`` cannot answer for it."""

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        node.left = _plain_checked(node.left)
        node.comparators = [_plain_checked(c) for c in node.comparators]
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        node.left, node.right = _plain_checked(node.left), _plain_checked(node.right)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        node.operand = _plain_checked(node.operand)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.value, ast.Call):
            node.value = _plain_checked(node.value)
        return node


class _Asserts(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        test = node.test
        if isinstance(test, ast.Compare):
            ops = [type(op).__name__ for op in test.ops]
            operands = [test.left, *test.comparators]
        else:
            ops, operands = [], [test]
        operands = [_Nested().visit(operand) for operand in operands]
        call = ast.Call(
            func=ast.Name(id="__maxent_check__", ctx=ast.Load()),
            args=[ast.Constant(value=tuple(ops)), *operands],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(value=call), node)


def prepare(tests: str, entry_point: Any) -> list[str]:
    """One source per top-level statement of the tests, asserts rewritten (SyntaxError raises)."""
    if entry_point and re.search(r"^def check\(", tests, re.MULTILINE):
        tests += f"\ncheck({entry_point})\n"
    module = ast.fix_missing_locations(_Asserts().visit(ast.parse(tests)))
    return [ast.unparse(statement) for statement in module.body]


def control(statements: list[str]) -> tuple[str, bytes]:
    """A fresh nonce and the control message the runner reads after the program ran."""
    nonce = secrets.token_hex(16)
    return nonce, json.dumps({"nonce": nonce, "tests": statements}).encode()


def _holds(ops: list[str], values: list[str]) -> bool:
    try:
        operands = [ast.literal_eval(value) for value in values]
        if not ops:
            return len(operands) == 1 and bool(operands[0])
        pairs = zip(ops, operands, operands[1:], strict=False)
        return len(operands) == len(ops) + 1 and all(_OPS[op](a, b) for op, a, b in pairs)
    except (ValueError, TypeError, SyntaxError, KeyError, MemoryError, RecursionError):
        return False


def verdict(channel: bytes, nonce: str, count: int) -> bool:
    """True when each of the `count` statements ran to its end and every check held."""
    done = set()
    for line in channel.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            return False
        if not isinstance(record, dict) or record.get("nonce") != nonce:
            return False
        if record.get("done") is True:
            done.add(record.get("statement"))
            continue
        ops, values = record.get("ops"), record.get("values")
        if not isinstance(ops, list) or not isinstance(values, list):
            return False
        if not all(isinstance(v, str) for v in values) or not _holds(ops, values):
            return False
    return done == set(range(count))

"""The trainer's side of ``python_unit_tests``: rewritten tests out, the verdict computed here.

:func:`prepare` splits the row's tests into top-level statements and rewrites every ``assert``
(a check site) into ``__maxent_check__(site, operand, ...)``: the operands of a comparison
(``a == b``, ``x in y``, chains too) or the asserted value. An operand that is a literal (the
expected value of ``assert f(x) == 5``) stays here and never reaches the sandbox; so do the
comparison operators. Inside the other operands, the operands of nested comparisons and
arithmetic and the object of a method called on a result pass ``__maxent_plain__``, which
stops the statement unless they are plain data. :func:`verdict` reads what the runner
(:mod:`maxent_grpo.rewards.unit_child`) sent back: every statement must have its ``done``
record, every site must have reported, and every check must hold when evaluated here, on the
operands rebuilt from their ``repr`` with ``ast.literal_eval`` and the literals kept here; the
program's own ``__eq__`` or ``__bool__`` never decides, and a program that writes records of
its own still has to produce the right values without seeing them.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import secrets
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Site:
    """One rewritten assert: its comparison operators and the literal operands kept here
    (position -> value); the runner reports the other operands, in order."""

    ops: tuple[str, ...]
    operands: int
    hidden: dict[int, Any] = field(default_factory=dict)

    def operands_from(self, shown: list[Any]) -> list[Any] | None:
        if len(shown) != self.operands - len(self.hidden):
            return None
        rest = iter(shown)
        return [self.hidden[i] if i in self.hidden else next(rest) for i in range(self.operands)]


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


class _Asserts(ast.NodeTransformer):
    def __init__(self) -> None:
        self.sites: list[Site] = []

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        test = node.test
        if isinstance(test, ast.Compare):
            ops = tuple(type(op).__name__ for op in test.ops)
            operands = [test.left, *test.comparators]
        else:
            ops, operands = (), [test]
        hidden, shown = {}, []
        for position, operand in enumerate(operands):
            is_literal, value = _literal(operand) if ops else (False, None)
            if is_literal:
                hidden[position] = value
            else:
                shown.append(_Nested().visit(operand))
        self.sites.append(Site(ops, len(operands), hidden))
        call = ast.Call(
            func=ast.Name(id="__maxent_check__", ctx=ast.Load()),
            args=[ast.Constant(value=len(self.sites) - 1), *shown],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(value=call), node)


@dataclass(frozen=True)
class Prepared:
    """The statements the runner gets, and the check sites the verdict keeps."""

    statements: list[str]
    sites: list[Site]


def prepare(tests: str, entry_point: Any) -> Prepared:
    """One source per top-level statement of the tests, asserts rewritten (SyntaxError raises)."""
    if entry_point and re.search(r"^def check\(", tests, re.MULTILINE):
        tests += f"\ncheck({entry_point})\n"
    rewrite = _Asserts()
    module = ast.fix_missing_locations(rewrite.visit(ast.parse(tests)))
    return Prepared([ast.unparse(statement) for statement in module.body], rewrite.sites)


def control(statements: list[str]) -> tuple[str, bytes]:
    """A fresh nonce and the control message the runner reads after the program ran."""
    nonce = secrets.token_hex(16)
    return nonce, json.dumps({"nonce": nonce, "tests": statements}).encode()


def _holds(site: Site, values: list[str]) -> bool:
    try:
        operands = site.operands_from([ast.literal_eval(value) for value in values])
        if operands is None:
            return False
        if not site.ops:
            return len(operands) == 1 and bool(operands[0])
        pairs = zip(site.ops, operands, operands[1:], strict=False)
        return all(_OPS[op](a, b) for op, a, b in pairs)
    except (ValueError, TypeError, SyntaxError, KeyError, MemoryError, RecursionError):
        return False


def verdict(channel: bytes, nonce: str, prepared: Prepared) -> bool:
    """True when each statement ran to its end, each site reported and every check held."""
    done, reported = set(), set()
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
        site, values = record.get("site"), record.get("values")
        if type(site) is not int or not 0 <= site < len(prepared.sites):
            return False
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return False
        if not _holds(prepared.sites[site], values):
            return False
        reported.add(site)
    statements = set(range(len(prepared.statements)))
    return done == statements and reported == set(range(len(prepared.sites)))

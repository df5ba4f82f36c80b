"""The trainer's half of a unit-test verdict: the program's values read back with hard limits,
and the tests' own expressions evaluated here on them.

:func:`decode` reads one value the sandbox's runner wrote (JSON, with tags for the types JSON
lacks: ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"f": [...]}`` frozenset, ``{"d": [[k,
v], ...]}`` dict, ``{"b": hex}`` bytes, ``{"c": [re, im]}`` complex): depth, size and hash
collisions are bounded, so no record costs more than a few milliseconds (``ast.literal_eval``
on a set of hash-colliding integers took 20-33 s). :func:`evaluate` computes an expression of
the test source (literals, operators, comparisons, a few pure built-ins and methods) with the
program's values bound to its holes, never calling anything of the program's.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from typing import Any

MAX_DEPTH = 32
MAX_ITEMS = 100_000  # values in one record
MAX_SIZE = 1_000_000  # length of a computed str, bytes or container
MAX_BITS = 100_000  # of a computed int


class Unjudgeable(ValueError):
    """A value or an expression this side does not take (the check fails)."""


def _check_hashes(items: list) -> list:
    """Refuse containers whose elements share hashes (quadratic to build a set or dict of)."""
    try:
        distinct = len({hash(item) for item in items})
    except TypeError as err:
        raise Unjudgeable("unhashable element") from err
    if len(items) - distinct > 64:
        raise Unjudgeable("elements with colliding hashes")
    return items


def decode(obj: Any, depth: int = 0, count: list[int] | None = None) -> Any:
    """A plain value from its JSON form (json.loads output); Unjudgeable when malformed."""
    count = count if count is not None else [0]
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_ITEMS:
        raise Unjudgeable("value too deep or too large")
    if obj is None or type(obj) in (bool, int, str):
        return obj
    if type(obj) is float:
        if not math.isfinite(obj):
            raise Unjudgeable("not a finite float")
        return obj
    if type(obj) is list:
        return [decode(item, depth + 1, count) for item in obj]
    if type(obj) is not dict or len(obj) != 1:
        raise Unjudgeable("not a tagged value")
    ((tag, body),) = obj.items()
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise Unjudgeable("malformed tagged value")
    items = [decode(item, depth + 1, count) for item in body]
    if tag == "t":
        return tuple(items)
    if tag in ("s", "f"):
        return (set if tag == "s" else frozenset)(_check_hashes(items))
    if tag == "d" and all(type(pair) is list and len(pair) == 2 for pair in items):
        _check_hashes([key for key, _ in items])
        return dict(items)
    if tag == "c" and len(items) == 2 and all(type(part) is float for part in items):
        return complex(*items)
    raise Unjudgeable(f"unknown tag {tag!r}")


class Approx:
    """``pytest.approx(expected, rel=1e-6, abs=1e-12)`` for a number, evaluated here."""

    def __init__(self, expected, rel=1e-6, abs=1e-12):  # noqa: A002 - pytest's names
        self.expected, self.rel, self.abs = expected, rel, abs

    def __eq__(self, other) -> bool:
        if isinstance(self.expected, (list, tuple)):
            pairs = (
                zip(self.expected, other, strict=True) if len(other) == len(self.expected) else None
            )
            return pairs is not None and all(Approx(e, self.rel, self.abs) == o for e, o in pairs)
        return math.isclose(other, self.expected, rel_tol=self.rel, abs_tol=self.abs)

    __hash__ = None


def _bounded(value: Any) -> Any:
    if type(value) is int and value.bit_length() > MAX_BITS:
        raise Unjudgeable("integer too large")
    if isinstance(value, (str, bytes, list, tuple, set, frozenset, dict)) and len(value) > MAX_SIZE:
        raise Unjudgeable("value too large")
    return value


def weight(value: Any, limit: int = MAX_SIZE) -> int:
    """What building or printing value costs: items and characters, a shared item counted each
    time it appears (``[s] * n`` weighs n times s). Unjudgeable past `limit`, found early."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        total += 1
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif type(item) is int:
            total += item.bit_length() >> 6
        elif isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack += item
        if total > limit:
            raise Unjudgeable("value too large")
    return total


def _pow(base, exponent, modulo=None):
    if type(exponent) is int and type(base) is int and exponent > 0:
        if modulo is None and base.bit_length() * exponent > MAX_BITS:
            raise Unjudgeable("power too large")
        if type(modulo) is int and exponent.bit_length() * modulo.bit_length() > 1 << 22:
            raise Unjudgeable("modular power too costly")
    return pow(base, exponent, modulo)


def _mul(a, b):
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, bytes, list, tuple)) and type(n) in (int, bool) and n > 0:
            if n > MAX_SIZE or weight(seq) * n > MAX_SIZE:
                raise Unjudgeable("product too large")
    if type(a) is int and type(b) is int and a.bit_length() + b.bit_length() > MAX_BITS:
        raise Unjudgeable("product too large")
    return a * b


def _add(a, b):
    if isinstance(a, (str, bytes, list, tuple)) and isinstance(b, (str, bytes, list, tuple)):
        if len(a) + len(b) > MAX_SIZE:
            raise Unjudgeable("sum too large")
    return a + b


def _shift(a, b):
    if type(b) is int and (b > MAX_BITS or (type(a) is int and a.bit_length() + b > MAX_BITS)):
        raise Unjudgeable("shift too large")
    return a << b


# A %-conversion: optional (key), flags, width, precision, length modifier, type.
_CONVERSION = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)


def _mod(a, b):
    """``a % b``; for a format string, its result's size is bounded before it is built (widths
    and precisions the program picks, a mapping's value used again and again)."""
    if not isinstance(a, (str, bytes)):
        return operator.mod(a, b)
    text = a.decode("latin-1") if isinstance(a, bytes) else a
    total, position = len(text), 0
    for key, width, precision, kind in _CONVERSION.findall(text):
        if "*" in (width, precision) or len(width) > 7 or len(precision or "") > 7:
            raise Unjudgeable("format width too large")
        total += int(width or 0) + int(precision or 0)
        if kind == "%":
            continue
        if key and isinstance(b, dict):
            argument = b.get(key)
        elif isinstance(b, tuple):
            argument, position = b[position : position + 1], position + 1
        else:
            argument = b
        total += 10 * weight(argument)  # repr escapes a character in at most 10
        if total > MAX_SIZE:
            raise Unjudgeable("formatted string too large")
    return a % b


def _round(number, ndigits=None):
    if type(ndigits) is int and abs(ndigits) > 4300:  # an int's round builds 10**ndigits
        raise Unjudgeable("round to too many digits")
    return round(number, ndigits)


def _sum(items, start=0):
    values = [*items, start]
    if not all(type(value) in (int, float, bool, complex) for value in values):
        raise Unjudgeable("sum of other than numbers")  # sum(lists, []) is quadratic
    return sum(items, start)


def _join(separator, items):
    items = list(items)
    if len(separator) * len(items) + sum(weight(item) for item in items) > MAX_SIZE:
        raise Unjudgeable("joined string too large")
    return separator.join(items)


def _replace(text, old, new, count=-1):
    found = text.count(old)
    found = found if type(count) is not int or count < 0 else min(found, count)
    if len(text) + found * max(0, len(new) - len(old)) > MAX_SIZE:
        raise Unjudgeable("replaced string too large")
    return text.replace(old, new, count)


def _range(*args):
    values = range(*args)
    if len(values) > MAX_SIZE:
        raise Unjudgeable("range too large")
    return list(values)


def _hashed(kind):
    return lambda items=(): kind(_check_hashes(list(items)))


#: The built-ins an expression here may call (pure, bounded by their inputs).
FUNCTIONS = {
    **{f.__name__: f for f in (sorted, list, tuple, len, abs, min, max, str)},
    **{f.__name__: f for f in (int, float, bool, any, all, repr, chr, ord, divmod, complex)},
    "round": _round,
    "sum": _sum,
    "set": _hashed(set),
    "frozenset": _hashed(frozenset),
    "dict": _hashed(dict),
    "reversed": lambda items: list(reversed(items)),
    "range": _range,
    "pow": _pow,
}
MODULE_FUNCTIONS = {
    ("math", name): getattr(math, name)
    for name in ("isclose", "fabs", "sqrt", "floor", "ceil", "log", "exp", "isqrt", "gcd")
}
MODULE_FUNCTIONS[("pytest", "approx")] = Approx
MODULE_CONSTANTS = {("math", name): getattr(math, name) for name in ("pi", "e", "tau", "inf")}
METHODS = {
    str: {"startswith", "endswith", "lower", "upper", "strip", "split", "splitlines", "count"}
    | {"find", "index", "isdigit", "isalpha", "replace", "join", "lstrip", "rstrip", "title"},
    list: {"count", "index"},
    tuple: {"count", "index"},
    dict: {"get", "keys", "values", "items"},
    set: {"issubset", "issuperset", "union", "intersection", "difference", "isdisjoint"},
    frozenset: {"issubset", "issuperset", "union", "intersection", "difference", "isdisjoint"},
    bytes: {"startswith", "endswith", "decode", "count", "find"},
}
#: Methods whose result can be far larger than their inputs: checked before they run.
_CAPPED_METHODS = {"join": _join, "replace": _replace}
_BINARY = {
    ast.Add: _add, ast.Sub: operator.sub, ast.Mult: _mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: _mod, ast.Pow: _pow,
    ast.LShift: _shift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_, ast.BitXor: operator.xor,
}  # fmt: skip
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}
_UNARY[ast.Invert] = operator.invert
_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip


def evaluate(node: ast.expr, env: dict[str, Any]) -> Any:
    """The value of an expression built only of what this module takes; env binds names."""
    return _bounded(_eval(node, env))


def _eval(node: ast.expr, env: dict[str, Any]) -> Any:  # noqa: PLR0911 - one case per node
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise Unjudgeable(f"unknown name {node.id}")
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [evaluate(item, env) for item in node.elts]
        kind = {ast.Tuple: tuple, ast.List: list, ast.Set: _hashed(set)}[type(node)]
        return kind(items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        keys = [evaluate(key, env) for key in node.keys]
        return dict(zip(_check_hashes(keys), [evaluate(v, env) for v in node.values], strict=True))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](evaluate(node.left, env), evaluate(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](evaluate(node.operand, env))
    if isinstance(node, ast.BoolOp):
        return _bool_op(node, env)
    if isinstance(node, ast.Compare):
        left = evaluate(node.left, env)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = evaluate(right_node, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return evaluate(node.body if evaluate(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Subscript):
        return evaluate(node.value, env)[_index(node.slice, env)]
    if isinstance(node, ast.Call):
        return _call(node, env)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if (node.value.id, node.attr) in MODULE_CONSTANTS:
            return MODULE_CONSTANTS[(node.value.id, node.attr)]
    raise Unjudgeable(f"{type(node).__name__} is not evaluated outside")


def _bool_op(node: ast.BoolOp, env: dict[str, Any]) -> Any:
    value = None
    for item in node.values:
        value = evaluate(item, env)
        if bool(value) is isinstance(node.op, ast.Or):
            return value
    return value


def _index(node: ast.expr, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if part is None else evaluate(part, env) for part in parts))
    return evaluate(node, env)


def _call(node: ast.Call, env: dict[str, Any]) -> Any:
    if any(isinstance(arg, ast.Starred) for arg in node.args):
        raise Unjudgeable("starred arguments")
    func = callee(node.func, env)
    if func is None:
        raise Unjudgeable(f"{ast.unparse(node.func)} is not called outside")
    args = [evaluate(arg, env) for arg in node.args]
    kwargs = {kw.arg: evaluate(kw.value, env) for kw in node.keywords if kw.arg}
    return func(*args, **kwargs)


def callee(node: ast.expr, env: dict[str, Any], check_methods: bool = True):
    """The function an outside call calls: a built-in of FUNCTIONS, math.x, pytest.approx, or
    an allowed method of a plain value (None: not outside)."""
    if isinstance(node, ast.Name) and node.id in FUNCTIONS and node.id not in env:
        return FUNCTIONS[node.id]
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in MODULE_FUNCTIONS:
        return MODULE_FUNCTIONS[(node.value.id, node.attr)]
    if not check_methods:
        return "method"
    owner = evaluate(node.value, env)
    if node.attr in METHODS.get(type(owner), ()):
        capped = _CAPPED_METHODS.get(node.attr) if isinstance(owner, (str, bytes)) else None
        return functools.partial(capped, owner) if capped else getattr(owner, node.attr)
    return None

"""The trainer's side of ``python_unit_tests``: rewritten tests out, the verdict computed here.

:func:`prepare` turns every check of the row's tests into a check site, whatever its form:
``assert x``, ``if x: raise ...`` (a check that ``not x``), unittest's ``self.assertEqual(a,
b)`` and its kin, in pytest-style ``test_*`` functions and unittest-style classes (which it
then calls). A site keeps the check's expression here; only its *holes*, the smallest parts
that need the program (a call of its function, a name the tests bind inside), go into the
sandbox as ``__maxent_check__(site, hole, ...)``. The expected side, the comparison and any
built-in applied to the program's answer (``set(f(x)) == set((4, 5))``) are evaluated here by
:mod:`maxent_grpo.rewards.outside`, on the values the runner (:mod:`~.unit_child`) reported,
with Python's own built-ins, never the program's. A top-level ``name = <literal expression>``
the tests bind is evaluated here too, and is sent into the sandbox only where the tests need it
there. Tests that cannot be judged this way (``assertRaises``, ``pytest.raises``, fixtures, no
check at all) are marked ``Prepared.unjudged``: they score 0.0 and are counted.

:func:`verdict` reads the records with hard limits: any malformed record scores that program
0.0; 1.0 needs every statement's ``done`` record, every site reported, every check holding.
"""

from __future__ import annotations

import ast
import builtins
import copy
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxent_grpo.rewards import outside

RUNNER = (Path(__file__).parent / "unit_child.py").read_text(encoding="utf-8")

# unittest's assert methods: the comparison they make (None: truth of the first argument).
_COMPARING = {
    "assertEqual": ast.Eq, "assertNotEqual": ast.NotEq, "assertIs": ast.Is,
    "assertIsNot": ast.IsNot, "assertIn": ast.In, "assertNotIn": ast.NotIn,
    "assertLess": ast.Lt, "assertLessEqual": ast.LtE, "assertGreater": ast.Gt,
    "assertGreaterEqual": ast.GtE, "assertListEqual": ast.Eq, "assertTupleEqual": ast.Eq,
    "assertDictEqual": ast.Eq, "assertSetEqual": ast.Eq, "assertSequenceEqual": ast.Eq,
    "assertMultiLineEqual": ast.Eq,
}  # fmt: skip
_TRUTH = {"assertTrue": False, "assertFalse": True, "assertIsNone": None, "assertIsNotNone": None}
_OUTSIDE_TYPES = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript)
_OUTSIDE_TYPES += (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Slice)
_BUILTINS = frozenset(dir(builtins))


def _hole(index: int) -> str:
    return f"__maxent_hole_{index}__"


class _Holes:
    """Splits a check's expression into what is evaluated here and its holes.

    A hole is a call of the program's own names (``program``: names the tests use but neither
    bind nor take from the built-ins, and names the tests bind once to such a call), or a part
    of its result (``f(x)[0]``, ``Solution().solve(x)``): evaluated in the sandbox and reported
    as plain data. Anything else that is not evaluated here (an imported name, a module
    constant the trainer does not know, a comprehension, a helper of the tests, an attribute of
    ``self``, a name the tests rebind) is ``refused``: the check is not judged."""

    def __init__(self, names: set[str], program: frozenset[str] = frozenset()):
        self.names, self.program, self.holes, self.refused = names, program, [], None

    def split(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Constant) or _module_constant(node):
            return node
        if isinstance(node, ast.Name) and node.id in self.names:
            return node
        if isinstance(node, ast.Call) and self._outside_call(node):
            if isinstance(node.func, ast.Attribute) and not _module_function(node.func):
                node.func.value = self.split(node.func.value)  # a method of a value
            node.args = [self.split(arg) for arg in node.args]
            for keyword in node.keywords:
                keyword.value = self.split(keyword.value)
            return node
        if isinstance(node, _OUTSIDE_TYPES) and not any(
            isinstance(child, ast.Starred) or (isinstance(node, ast.Dict) and child is None)
            for child in [*getattr(node, "elts", []), *getattr(node, "keys", [])]
        ):
            for name, value in ast.iter_fields(node):
                if isinstance(value, ast.expr):
                    setattr(node, name, self.split(value))
                elif isinstance(value, list) and value and isinstance(value[0], ast.expr):
                    setattr(node, name, [self.split(item) for item in value])
            return node
        if self.programs(node):
            self.holes.append(node)
            return ast.Name(id=_hole(len(self.holes) - 1), ctx=ast.Load())
        self.refused = self.refused or ast.unparse(node)[:80]
        return node

    def programs(self, node: ast.expr) -> bool:
        """A call of the program's names, or a part of one's result."""
        if isinstance(node, ast.Call):
            return self._rooted(node.func)
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            return self.programs(node.value)
        return False

    def _rooted(self, func: ast.expr) -> bool:
        if isinstance(func, ast.Name):
            return func.id in self.program
        if isinstance(func, ast.Attribute):
            return self._rooted(func.value) or self.programs(func.value)
        return isinstance(func, ast.Call) and self.programs(func)

    def _outside_call(self, node: ast.Call) -> bool:
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            return False
        if any(keyword.arg is None for keyword in node.keywords):
            return False
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in outside.FUNCTIONS and func.id not in self.names
        if not isinstance(func, ast.Attribute):
            return False
        return _module_function(func) or any(func.attr in m for m in outside.METHODS.values())


def _module_constant(node: ast.expr) -> bool:
    """math.pi, math.inf, ...: a constant of outside.MODULE_CONSTANTS."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and (node.value.id, node.attr) in outside.MODULE_CONSTANTS
    )


def _module_function(func: ast.Attribute) -> bool:
    """math.isclose, pytest.approx, ...: a function of outside.MODULE_FUNCTIONS."""
    owner = func.value
    return isinstance(owner, ast.Name) and (owner.id, func.attr) in outside.MODULE_FUNCTIONS


@dataclass(frozen=True)
class Site:
    """One check: its expression, evaluated here with its holes bound to reported values."""

    expression: ast.expr
    holes: int

    def holds(self, values: list[Any], env: dict[str, Any]) -> bool:
        if len(values) != self.holes:
            return False
        bound = {**env, **{_hole(i): value for i, value in enumerate(values)}}
        return bool(outside.evaluate(self.expression, bound))


def _unittest_check(call: ast.Call) -> ast.expr | None:
    """The expression a ``self.assertX(...)`` call checks (None: not one this side judges)."""
    name, args = call.func.attr, call.args
    if name in _COMPARING and len(args) >= 2:
        return ast.Compare(left=args[0], ops=[_COMPARING[name]()], comparators=[args[1]])
    if name in _TRUTH and args:
        if name in ("assertIsNone", "assertIsNotNone"):
            op = ast.Is() if name == "assertIsNone" else ast.IsNot()
            return ast.Compare(left=args[0], ops=[op], comparators=[ast.Constant(None)])
        return ast.UnaryOp(op=ast.Not(), operand=args[0]) if _TRUTH[name] else args[0]
    if name in ("assertAlmostEqual", "assertNotAlmostEqual") and len(args) >= 2:
        keywords = {kw.arg: kw.value for kw in call.keywords}
        difference = ast.Call(
            ast.Name("abs", ast.Load()), [ast.BinOp(args[0], ast.Sub(), args[1])], []
        )
        if "delta" in keywords:
            check = ast.Compare(difference, [ast.LtE()], [keywords["delta"]])
        else:
            places = args[2] if len(args) > 2 else keywords.get("places", ast.Constant(7))
            rounded = ast.Call(ast.Name("round", ast.Load()), [difference, places], [])
            check = ast.Compare(rounded, [ast.Eq()], [ast.Constant(0)])
        return check if name == "assertAlmostEqual" else ast.UnaryOp(ast.Not(), check)
    return None


def _is_self_assert(node: ast.AST) -> bool:
    func = getattr(node, "func", None)
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and (func.value.id == "self" and (func.attr.startswith("assert") or func.attr == "fail"))
    )


class _Checks(ast.NodeTransformer):
    """Every check becomes ``__maxent_check__(site, hole, ...)``; the site stays here."""

    def __init__(self, names: set[str], program: frozenset[str]):
        self.names, self.program, self.sites, self.unjudged = names, program, [], None

    def _site(self, node: ast.stmt, expression: ast.expr) -> ast.stmt:
        holes = _Holes(self.names, self.program)
        kept = ast.fix_missing_locations(holes.split(expression))
        if holes.refused and not self.unjudged:
            self.unjudged = (
                f"`{holes.refused}` in a check needs the sandbox's objects (judged here: "
                "literals, built-ins, calls of the program's names)"
            )
        self.sites.append(Site(kept, len(holes.holes)))
        args = [ast.Constant(value=len(self.sites) - 1), *holes.holes]
        call = ast.Call(
            func=ast.Name(id="__maxent_check__", ctx=ast.Load()), args=args, keywords=[]
        )
        return ast.copy_location(ast.Expr(value=call), node)

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        return self._site(node, node.test)

    def visit_If(self, node: ast.If) -> ast.stmt:
        if len(node.body) == 1 and isinstance(node.body[0], ast.Raise) and not node.orelse:
            return self._site(node, ast.UnaryOp(op=ast.Not(), operand=node.test))
        return self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:
        if _is_self_assert(node.value):
            check = _unittest_check(node.value)
            if check is not None:
                return self._site(node, check)
        return self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if _is_self_assert(node) or "pytest.raises" in _dotted(node) or "fixture" in _dotted(node):
            self.unjudged = (
                self.unjudged or f"{_dotted(node) or 'self.assert...'} is not judged outside"
            )
        return super().generic_visit(node)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


@dataclass(frozen=True)
class Prepared:
    """The statements the runner gets, the sites and values kept here, and why the tests
    cannot be judged here (None when they can)."""

    statements: list[str]
    sites: list[Site]
    env: dict[str, Any] = field(default_factory=dict)
    unjudged: str | None = None


def _bindings(module: ast.Module) -> dict[str, int]:
    """How many times each name is bound anywhere in the tests."""
    counts: dict[str, int] = {}
    for node in ast.walk(module):
        names = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [(node.asname or node.name).split(".")[0]]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _constants(module: ast.Module, bound: dict[str, int]) -> dict[str, Any]:
    """``name = <expression of literals and built-ins>``, the name bound once in all the tests
    (at the top or inside a test function): their values, evaluated here."""
    env: dict[str, Any] = {}
    for statement in ast.walk(module):
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        target = statement.targets[0]
        if not isinstance(target, ast.Name) or bound.get(target.id) != 1:
            continue
        holes = _Holes(set(env))
        expression = holes.split(copy.deepcopy(statement.value))
        if not holes.holes and not holes.refused:
            try:
                env[target.id] = outside.evaluate(expression, env)
            except (outside.Unjudgeable, ValueError, TypeError, ArithmeticError):
                continue
    return env


def _program_names(module: ast.Module, bound: dict[str, int]) -> frozenset[str]:
    """The names a hole may call: used by the tests, bound neither by them nor as built-ins
    (the program's functions and classes), and the tests' top-level names bound once to a
    call of those (``s = Solution()``)."""
    used = {n.id for n in ast.walk(module) if isinstance(n, ast.Name)}
    program = {name for name in used if name not in bound and name not in _BUILTINS}
    for statement in module.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name) and bound.get(target.id) == 1:
                if _Holes(set(), frozenset(program)).programs(statement.value):
                    program.add(target.id)
    return frozenset(program)


class _Aliases(ast.NodeTransformer):
    """``from math import isclose`` and HumanEval's ``check(candidate)``: the name is read as
    what it stands for (``math.isclose``, the entry point), so that it is judged as that."""

    def __init__(self, module: ast.Module, entry_point: Any):
        self.names: dict[str, ast.expr] = {}
        bound = _bindings(module)
        for node in module.body:
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    name = alias.asname or alias.name
                    known = {*outside.MODULE_FUNCTIONS, *outside.MODULE_CONSTANTS}
                    if (node.module, alias.name) in known and bound.get(name) == 1:
                        value = ast.Name(id=node.module, ctx=ast.Load())
                        self.names[name] = ast.Attribute(value, alias.name, ast.Load())
            if isinstance(node, ast.FunctionDef) and node.name == "check" and entry_point:
                if len(node.args.args) == 1 and bound.get(node.args.args[0].arg) == 1:
                    entry = ast.Name(id=str(entry_point), ctx=ast.Load())
                    self.names[node.args.args[0].arg] = entry

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.names:
            return ast.copy_location(copy.deepcopy(self.names[node.id]), node)
        return node


def _is_main(statement: ast.stmt) -> bool:
    """``if __name__ == "__main__": ...`` or ``unittest.main()``: the runner runs the tests."""
    if isinstance(statement, ast.If) and "__name__" in ast.unparse(statement.test):
        return True
    value = getattr(statement, "value", None)
    return isinstance(statement, ast.Expr) and _dotted(value) in ("unittest.main", "pytest.main")


def _drivers(module: ast.Module) -> tuple[list[str], str | None]:
    """Calls of the pytest-style ``test_*`` functions and of unittest-style test methods."""
    drivers, unjudged = [], None
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if node.args.args or node.decorator_list:
                unjudged = f"{node.name} takes fixtures or is decorated"
            drivers.append(f"{node.name}()")
        if not isinstance(node, ast.ClassDef):
            continue
        case = any(ast.unparse(base).endswith("TestCase") for base in node.bases)
        for method in node.body:
            if not (isinstance(method, ast.FunctionDef) and method.name.startswith("test")):
                continue
            if method.decorator_list:
                unjudged = f"{node.name}.{method.name} is decorated"
            if case:
                drivers.append(
                    f"{node.name}.setUpClass()\n__maxent_case__ = {node.name}({method.name!r})\n"
                    f"__maxent_case__.setUp()\n__maxent_case__.{method.name}()\n"
                    "__maxent_case__.tearDown()"
                )
            else:
                drivers.append(f"{node.name}().{method.name}()")
    return drivers, unjudged


def prepare(tests: str, entry_point: Any) -> Prepared:
    """The runner's statements (one per top-level statement of the tests, checks rewritten,
    test functions and methods called at the end) and the sites kept here (SyntaxError
    raises)."""
    if entry_point and re.search(r"^def check\(", tests, re.MULTILINE):
        tests += f"\ncheck({entry_point})\n"
    module = ast.parse(tests)
    module.body = [statement for statement in module.body if not _is_main(statement)]
    module = ast.fix_missing_locations(_Aliases(module, entry_point).visit(module))
    bound = _bindings(module)
    env = _constants(module, bound)
    drivers, unjudged = _drivers(module)
    checks = _Checks(set(env), _program_names(module, bound))
    module = ast.fix_missing_locations(checks.visit(module))
    loads = [
        {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)}
        for statement in module.body
    ]
    statements = []
    for index, statement in enumerate(module.body):
        name = getattr(statement, "targets", [None])[0]
        needed = set().union(*(names for i, names in enumerate(loads) if i != index))
        kept_here = getattr(name, "id", None) in set(env) - needed  # never sent inside
        statements.append("pass" if kept_here else ast.unparse(statement))
    unjudged = unjudged or checks.unjudged or (None if checks.sites else "the tests check nothing")
    return Prepared([*statements, *drivers], checks.sites, env, unjudged)


def control(statements: list[str]) -> tuple[str, bytes]:
    """A fresh nonce and the control message the runner reads after the program ran."""
    nonce = secrets.token_hex(16)
    return nonce, json.dumps({"nonce": nonce, "tests": statements}).encode()


def _reject(token: str) -> None:
    raise outside.Unjudgeable(f"{token} is not a value")


def verdict(channel: bytes, nonce: str, prepared: Prepared, seconds: float = 2.0) -> bool:
    """True when each statement ran to its end, each site reported and every check held.
    A malformed record, or records that take more than `seconds` to judge, give False."""
    try:
        return _verdict(channel, nonce, prepared, time.monotonic() + seconds)
    except Exception:  # noqa: BLE001 - whatever the program wrote scores it 0, never the batch
        return False


def _verdict(channel: bytes, nonce: str, prepared: Prepared, deadline: float) -> bool:
    done, reported = set(), set()
    statements, sites = len(prepared.statements), len(prepared.sites)
    for line in channel.splitlines():
        if time.monotonic() > deadline:
            return False
        record = json.loads(line, parse_constant=_reject)
        if type(record) is not dict or record.get("nonce") != nonce:
            return False
        statement = record.get("statement")
        if type(statement) is not int or not 0 <= statement < statements:
            return False
        if record.get("done") is True:
            done.add(statement)
            continue
        site, values = record.get("site"), record.get("values")
        if type(site) is not int or not 0 <= site < sites or type(values) is not list:
            return False
        if not prepared.sites[site].holds([outside.decode(v) for v in values], prepared.env):
            return False
        reported.add(site)
    return len(done) == statements and len(reported) == sites

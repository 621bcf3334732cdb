"""Safe arithmetic over knob values, for user-written relations and formulas.

Campaign files may say ``micro_batch * grad_accum * nproc == 480`` or
``tokens_per_step: "micro_batch * grad_accum * 1024"``. These are parsed with ``ast`` and
evaluated over a closed set of node types: numbers, knob names, arithmetic, comparisons and
boolean logic. Nothing in them is ever executed as Python.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


class ExprError(ValueError):
    pass


def parse(text: str) -> ast.Expression:
    """Parse and vet an expression; raise ExprError naming what is not allowed."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse {text!r}: {e.msg}") from None
    allowed = (
        ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.Compare,
        ast.BoolOp, ast.And, ast.Or, *_BINARY, *_COMPARE, *_UNARY,
    )
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise ExprError(f"{text!r}: {type(node).__name__} is not allowed (only arithmetic over knob names)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | str | bool):
            raise ExprError(f"{text!r}: constant {node.value!r} is not allowed")
    return tree


def names(text: str) -> set[str]:
    return {n.id for n in ast.walk(parse(text)) if isinstance(n, ast.Name)}


def evaluate(text: str, values: Mapping[str, Any]) -> Any:
    """Evaluate ``text`` with knob names bound to ``values``."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise ExprError(f"{text!r}: unknown name '{node.id}'; known: {', '.join(sorted(values))}")
            return values[node.id]
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BoolOp):
            results = [ev(v) for v in node.values]
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = ev(comparator)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        raise ExprError(f"{text!r}: {type(node).__name__} is not allowed")

    try:
        return ev(parse(text))
    except ZeroDivisionError:
        raise ExprError(f"{text!r}: division by zero") from None

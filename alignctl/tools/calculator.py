"""The ``calculator`` tool: arithmetic on an AST allow-list, never ``eval``.

Allowed: int and float literals, + - * / // % **, unary + -, parentheses. Everything else
(names, calls, attributes, subscripts, comparisons, strings) is refused. Powers are bounded
(exponent <= 100, |base| <= 10^6) and results beyond 10^100 refused, so ``9**9**9`` cannot stall
the rollout. Integer results print without a decimal point; floats with up to 12 significant
digits.
"""

from __future__ import annotations

import ast
import math
import operator

from alignctl.tools.tool import register_tool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT, MAX_BASE, MAX_MAGNITUDE, MAX_CHARS = 100, 10**6, 10**100, 500


class CalculatorError(ValueError):
    pass


def evaluate(expression: str) -> int | float:
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or abs(left) > MAX_BASE):
            raise CalculatorError(f"power too large: {left} ** {right}")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        if isinstance(result, complex) or (isinstance(result, (int, float)) and abs(result) > MAX_MAGNITUDE):
            raise CalculatorError("result out of range")
        return result
    raise CalculatorError(f"{type(node).__name__} is not allowed; only numbers, + - * / // % ** and parentheses")


def format_number(value: int | float) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result is not a finite number")
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


@register_tool("calculator", "Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
               {"type": "object", "properties": {"expression": {"type": "string", "description":
                                                                "for example (12 + 7) * 3"}},
                "required": ["expression"]}, timeout_s=2.0)
def calculator(expression: str) -> str:
    return format_number(evaluate(expression))

"""A symbolic size as JSON over a graph's inputs, and back on another process's inputs.

A DDP subgraph with a length that changes returns tensors whose sizes and strides are sympy
expressions over symbols (``2*s0``, ``64*s0``), and another process names its symbols
otherwise (``s3`` for the same length). So a size is written over the inputs instead: each
symbol as the input that is it (``["in", i]``) or the input tensor's dimension that holds it
(``["in", i, d]``), and sums, products, floor divisions, remainders, powers, max and min of
those (``["*", 2, ["in", 1, 0]]``). ``evaluated`` makes it again on the other process's
inputs, with its symbols, as its own trace would have made it.

Rejected: sympy's printed form and its parser (``sympify`` evaluates Python, and these are
read from Redis: ``valid`` checks one before it is evaluated); symbols by name (they differ
between processes).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

#: Where a symbol is found again: ``["in", i]`` or ``["in", i, d]``.
Place = list[int | str]


class Unsaid(Exception):
    """A size these expressions cannot say (a symbol no input holds, an unknown function), or
    one whose inputs are not what it says."""


#: Each operation an expression may hold, on ints and symbolic ints alike.
OPS: dict[str, Callable[..., Any]] = {
    "+": lambda *xs: functools.reduce(operator.add, xs),
    "*": lambda *xs: functools.reduce(operator.mul, xs),
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "max": lambda *xs: functools.reduce(_sym_max, xs),
    "min": lambda *xs: functools.reduce(_sym_min, xs),
}
#: How deep an expression read from Redis may nest (a size is a product or a sum of a few),
#: and the largest power it may raise to (no size is a symbol to the 65th).
_MAX_DEPTH = 16
_MAX_POWER = 64


def _sym_max(a: Any, b: Any) -> Any:
    import torch

    return torch.sym_max(a, b)


def _sym_min(a: Any, b: Any) -> Any:
    import torch

    return torch.sym_min(a, b)


def symbols_of(inputs: Any) -> dict[Any, Place]:
    """Each symbol an input is, or an input tensor's dimension is: where to find it again."""
    import sympy
    import torch

    found: dict[Any, Place] = {}
    for i, value in enumerate(inputs):
        if isinstance(value, torch.SymInt):
            places: list[tuple[Any, Place]] = [(value, ["in", i])]
        elif isinstance(value, torch.Tensor):
            places = [(n, ["in", i, d]) for d, n in enumerate(value.shape)]
        else:
            continue
        for n, place in places:
            if isinstance(n, torch.SymInt) and isinstance(n.node.expr, sympy.Symbol):
                found.setdefault(n.node.expr, place)
    return found


def expression(value: Any, symbols: dict[Any, Place]) -> Any:
    """``value`` (an int or a symbolic int) as an expression over ``symbols``."""
    if type(value) is int:
        return value
    import torch

    if not isinstance(value, torch.SymInt):
        raise Unsaid
    return _tree(value.node.expr, symbols)


def _tree(expr: Any, symbols: dict[Any, Place]) -> Any:
    import sympy
    from torch.utils._sympy import functions as fn

    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr not in symbols:
            raise Unsaid  # a size known only at run time, or held by no input
        return symbols[expr]
    operands = [_tree(a, symbols) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return ["+", *operands]
    if isinstance(expr, sympy.Mul):
        return ["*", *operands]
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and expr.exp >= 0:
        return ["**", *operands]
    for names, op in _FUNCTIONS:
        kinds = tuple(k for k in (getattr(fn, n, None) for n in names) if isinstance(k, type))
        if kinds and isinstance(expr, kinds):
            return [op, *operands]
    raise Unsaid


#: torch's sympy functions a size may hold (by name: each torch has its own set), and their ops.
_FUNCTIONS = (
    (("FloorDiv",), "//"),
    (("PythonMod", "Mod"), "%"),
    (("Max",), "max"),
    (("Min",), "min"),
)


def valid(tree: Any, depth: int = 0) -> bool:
    """Whether ``tree`` (read from Redis) is an expression ``_tree`` writes."""
    if type(tree) is int:
        return True
    if not isinstance(tree, list) or not tree or depth > _MAX_DEPTH:
        return False
    head, rest = tree[0], tree[1:]
    if head == "in":
        return len(rest) in (1, 2) and all(type(n) is int and n >= 0 for n in rest)
    if head not in OPS:
        return False
    arity_ok = len(rest) == 2 if head in ("//", "%", "**") else len(rest) >= 2
    if head == "**" and arity_ok and not (type(rest[1]) is int and 0 <= rest[1] <= _MAX_POWER):
        return False
    return arity_ok and all(valid(t, depth + 1) for t in rest)


def evaluated(tree: Any, inputs: Any) -> Any:
    """``tree`` on ``inputs``: an int, or a symbolic int of their shape environment. Raises
    ``Unsaid`` where an input is not what the record says."""
    import torch

    if type(tree) is int:
        return tree
    head, rest = tree[0], tree[1:]
    if head == "in":
        if rest[0] >= len(inputs):
            raise Unsaid
        value = inputs[rest[0]]
        if len(rest) == 2:
            if not isinstance(value, torch.Tensor) or rest[1] >= value.dim():
                raise Unsaid
            value = value.shape[rest[1]]
        if not isinstance(value, torch.SymInt):
            raise Unsaid  # where a symbol was, this key's inputs have one too
        return value
    return OPS[head](*(evaluated(t, inputs) for t in rest))

"""A decorated function whose input length changes: which graphs Dynamo compiled dynamic.

    python decorated_lengths.py

The function is wrapped by a decorator, as transformers wraps its models' forwards: the frame
Dynamo compiles is the wrapper, whose closure holds the wrapped function. Lengths 4, 5 and 6;
prints one JSON line, ``{"dynamic": [...]}``: for each graph the backend was given, whether one
of its sizes was symbolic. The backend only records (no codegen: what is tested is Dynamo's),
so Inductor is imported here, as any Inductor user's first compile imports it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.compile_fx  # Inductor loading: where `compileq run` installs


def returns_as_is(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def arithmetic(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(dim=-1) + 1


#: The same, decorated: the frame Dynamo compiles is the wrapper, ``arithmetic`` in its closure.
step = returns_as_is(arithmetic)


def recording(graphs: list[bool]) -> Callable[..., Any]:
    """A backend that appends to ``graphs`` whether each graph it gets is dynamic (a symbolic
    size among its inputs) and runs it as traced. tests/test_dynamic_profile.py uses it too."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(
            any(
                isinstance(x, torch.SymInt)
                or (
                    isinstance(x, torch.Tensor)
                    and any(isinstance(s, torch.SymInt) for s in x.shape)
                )
                for x in example_inputs
            )
        )
        return gm.forward

    return backend


def run_lengths(fn: Callable[[torch.Tensor], torch.Tensor], *lengths: int) -> None:
    """``fn`` on inputs of each length, checked against ``arithmetic`` run eagerly."""
    for n in lengths:
        x = torch.arange(3 * n, dtype=torch.float32).reshape(3, n)
        assert torch.equal(fn(x), arithmetic(x))


def main() -> None:
    graphs: list[bool] = []
    run_lengths(torch.compile(step, backend=recording(graphs)), 4, 5, 6)
    print(json.dumps({"dynamic": graphs}))


if __name__ == "__main__":
    main()

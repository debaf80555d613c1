"""Every operation's docstring documents each argument and gives an example, as pyinfra's do.

The format is pyinfra's own (``pyinfra/operations/*.py``): a summary, one ``+ arg: meaning``
line per argument of the wrapped function, then ``**Example:**`` and a ``.. code:: python``
block. The example must parse and call the operation only with arguments it takes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap

import pytest
from pyinfra.api import operation
from pyinfra.api.arguments import all_global_arguments

import pve_sglang.operations
from pve_sglang.runtime.pyinfra_private import operation_function

GLOBAL_ARGS = {name for name, _ in all_global_arguments()}
ARG_LINE = re.compile(r"^\s*\+ (\w+): \S", re.MULTILINE)
EXAMPLE = re.compile(r"\*\*Examples?:\*\*\s*\n\s*\.\. code:: python\s*\n((?:\n|[ \t]+.*\n?)+)")


def operations() -> list:
    """Every ``@operation`` defined in a module of ``pve_sglang.operations``."""
    found = []
    for info in pkgutil.iter_modules(pve_sglang.operations.__path__):
        module = importlib.import_module(f"pve_sglang.operations.{info.name}")
        for name, value in vars(module).items():
            body = operation_function(value)
            if body is not None and body.__module__ == module.__name__:
                found.append(pytest.param(value, id=f"{info.name}.{name}"))
    return found


def doc_problems(op) -> list[str]:
    """What OP's docstring lacks; empty when it documents every argument and has an example."""
    doc = inspect.getdoc(op) or ""
    body = operation_function(op)
    params = [name for name in inspect.signature(body).parameters]
    documented = ARG_LINE.findall(doc)
    problems = [f"argument {name!r} is not documented (`+ {name}: ...`)"
                for name in params if name not in documented]
    problems += [f"documents {name!r}, which it does not take" for name in documented
                 if name not in params]
    if not doc.split("\n\n", 1)[0].strip() or doc.lstrip().startswith("+"):
        problems.append("no summary before the arguments")
    example = EXAMPLE.search(doc)
    if not example:
        return problems + ["no **Example:** with a `.. code:: python` block"]
    code = textwrap.dedent(example.group(1))
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        return problems + [f"the example does not parse: {error}"]
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == body.__name__]
    if not calls:
        problems.append(f"the example does not call {body.__name__}()")
    for call in calls:
        given = {kw.arg for kw in call.keywords}
        problems += [f"the example passes {kw!r}, which it does not take"
                     for kw in sorted(given - set(params) - GLOBAL_ARGS)]
        required = {name for name, p in inspect.signature(body).parameters.items()
                    if p.default is inspect.Parameter.empty}
        problems += [f"the example leaves out the required {name!r}"
                     for name in sorted(required - given)]
    return problems


def test_every_operation_is_found():
    # 25 when this test was written; a module that stops being scanned would pass silently.
    assert len(operations()) >= 25


@pytest.mark.parametrize("op", operations())
def test_docstring_documents_arguments_and_example(op):
    assert doc_problems(op) == []


def test_an_undocumented_argument_fails():
    @operation()
    def sample(path: str, mode: str):
        """
        A directory at PATH.

        + path: where it goes

        **Example:**

        .. code:: python

            sample.sample(name="d", path="/tmp/d", mode="755")
        """
        yield from ()

    assert doc_problems(sample) == ["argument 'mode' is not documented (`+ mode: ...`)"]


def test_a_missing_or_wrong_example_fails():
    @operation()
    def sample(path: str):
        """
        A directory at PATH.

        + path: where it goes
        """
        yield from ()

    assert doc_problems(sample) == ["no **Example:** with a `.. code:: python` block"]
    sample.__doc__ = operation_function(sample).__doc__ = inspect.getdoc(sample) + (
        "\n\n**Example:**\n\n.. code:: python\n\n    sample.sample(name='d', paht='/tmp/d')\n"
    )
    assert doc_problems(sample) == ["the example passes 'paht', which it does not take",
                                    "the example leaves out the required 'path'"]

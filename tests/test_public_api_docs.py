"""The public API's docstrings: every function and method of ``specobs.__all__`` that takes
arguments has an ``Args:`` section naming each of them, and a ``Returns:`` section where it
returns something. Dataclass fields are documented where the fields are declared."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import specobs


def public_callables() -> Iterator[tuple[str, Callable[..., Any], str]]:
    """``(qualified name, function, its docstring)``; an ``__init__`` may be documented on
    its class."""
    for name in specobs.__all__:
        obj = getattr(specobs, name)
        if inspect.isfunction(obj):
            yield name, obj, inspect.getdoc(obj) or ""
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr, member in vars(obj).items():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if not inspect.isfunction(member) or (attr.startswith("_") and attr != "__init__"):
                continue
            if attr == "__init__":
                if dataclasses.is_dataclass(obj) or getattr(obj, "_is_protocol", False):
                    continue
                doc = (member.__doc__ or "") + "\n" + (obj.__doc__ or "")
                yield f"{name}.__init__", member, inspect.cleandoc(doc)
            else:
                yield f"{name}.{attr}", member, inspect.getdoc(getattr(obj, attr)) or ""


def undocumented(name: str, fn: Callable[..., Any], doc: str) -> list[str]:
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters if p not in ("self", "cls")]
    params = [p for p in params if sig.parameters[p].kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    out = []
    if params:
        args = doc.partition("Args:")[2]
        if not doc.count("Args:"):
            out.append(f"{name}: no Args: section")
        else:
            out += [f"{name}: Args: does not name {p!r}" for p in params
                    if not re.search(rf"^\s+{re.escape(p)}( \(.*\))?:", args, re.M)]
        ret = sig.return_annotation
        if ret not in (None, "None", inspect.Signature.empty) and "Returns:" not in doc \
                and name.rpartition(".")[2] != "__init__":
            out.append(f"{name}: returns {ret} without a Returns: section")
    return out


def test_every_public_function_documents_its_arguments_and_result() -> None:
    found = [msg for name, fn, doc in public_callables() for msg in undocumented(name, fn, doc)]
    assert not found, "\n".join(found)


def test_the_check_finds_a_missing_argument_and_result() -> None:
    def f(x: int, y: int) -> int:
        """Adds.

        Args:
            x: one.
        """
        return x + y

    assert undocumented("f", f, inspect.getdoc(f) or "") == [
        "f: Args: does not name 'y'", "f: returns int without a Returns: section"]
    assert any("public" in n or "." in n for n, _, _ in public_callables())

"""An engine's installed files, read as :mod:`ast` trees: the engine is never imported.

:class:`SourceTree` parses the modules a hook point names on demand and resolves a class through
``from X import Y`` and its base classes, so an inherited method or field counts. The contract
check (:mod:`specobs.instrument._contract`) reads it. Stdlib only, like the check.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SourceTree", "params", "spec_root"]


def spec_root(top_level: str) -> Path | None:
    """Where the import system would find ``top_level`` (an editable install), not importing it:
    ``find_spec`` of a top-level name runs no package code."""
    try:
        spec = importlib.util.find_spec(top_level)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]).parent if locations else None


@dataclass(frozen=True)
class _Found:
    module: str
    node: ast.ClassDef


class SourceTree:
    """Modules under ``root`` parsed on demand; classes resolved through imports and bases."""

    _DEPTH = 8

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[str, ast.Module | None] = {}

    def file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def relative(self, module: str) -> str:
        path = self.file(module)
        return module.replace(".", "/") + ".py" if path is None else str(
            path.relative_to(self.root))

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.file(module)
            try:
                self._trees[module] = None if path is None else ast.parse(
                    path.read_text(encoding="utf-8", errors="replace"))
            except SyntaxError:
                self._trees[module] = None
        return self._trees[module]

    def find_class(self, module: str, name: str, depth: int = 0) -> _Found | None:
        """Class ``name`` as ``module`` sees it: defined there or imported (``from X import Y``)."""
        tree = self.tree(module)
        if tree is None or depth > self._DEPTH:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return _Found(module, node)
        imported = self._imported(module, tree, name)
        return None if imported is None else self.find_class(*imported, depth + 1)

    def function(self, module: str, name: str, depth: int = 0) -> str:
        """``file:line`` of the module-level function ``name`` as ``module`` sees it (defined
        there or imported), else empty."""
        tree = self.tree(module)
        if tree is None or depth > self._DEPTH:
            return ""
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return f"{self.relative(module)}:{node.lineno}"
        imported = self._imported(module, tree, name)
        return "" if imported is None else self.function(*imported, depth + 1)

    def _imported(self, module: str, tree: ast.Module, name: str) -> tuple[str, str] | None:
        """``(source module, its name)`` where ``module`` imports ``name`` with ``from X import``
        (relative imports resolved), else ``None``."""
        for node in _top_level(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, node, self.file(module))
                for alias in node.names:
                    if (alias.asname or alias.name) == name and source:
                        return source, alias.name
        return None

    def _resolve_base(self, module: str, expr: ast.expr, depth: int) -> _Found | None:
        if isinstance(expr, ast.Subscript):  # Generic[T], SomeBase[Config]
            expr = expr.value
        if isinstance(expr, ast.Name):
            return self.find_class(module, expr.id, depth + 1)
        if isinstance(expr, ast.Attribute):
            dotted = ast.unparse(expr.value)
            tree = self.tree(module)
            target = dotted
            for node in _top_level(tree) if tree is not None else ():
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname == dotted:
                            target = alias.name
                elif isinstance(node, ast.ImportFrom):
                    source = _absolute(module, node, self.file(module))
                    for alias in node.names:
                        if (alias.asname or alias.name) == dotted and source:
                            target = f"{source}.{alias.name}"
            return self.find_class(target, expr.attr, depth + 1)
        return None

    def mro(self, found: _Found, depth: int = 0) -> Iterator[_Found]:
        """The class, then its bases depth first (those that resolve inside ``root``)."""
        yield found
        if depth > self._DEPTH:
            return
        for base in found.node.bases:
            resolved = self._resolve_base(found.module, base, depth)
            if resolved is not None:
                yield from self.mro(resolved, depth + 1)

    def method(self, found: _Found, name: str) -> tuple[_Found, ast.FunctionDef
                                                         | ast.AsyncFunctionDef] | None:
        for owner in self.mro(found):
            for node in owner.node.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                    return owner, node
        return None

    def fields(self, found: _Found) -> set[str]:
        names: set[str] = set()
        for owner in self.mro(found):
            names |= _own_fields(owner.node)
        return names


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Module statements, including those under ``if``/``try`` (``if TYPE_CHECKING:`` imports)."""
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If | ast.Try):
            children = [*node.body, *node.orelse]
            if isinstance(node, ast.Try):
                children += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
            stack.extend(reversed(children))


def _absolute(module: str, node: ast.ImportFrom, path: Path | None) -> str:
    if not node.level:
        return node.module or ""
    package = module if path is not None and path.name == "__init__.py" else (
        module.rpartition(".")[0])
    parts = package.split(".")
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def _own_fields(cls: ast.ClassDef) -> set[str]:
    """Annotated fields, class attributes, properties and ``self.X`` stores of one class."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any("property" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    for sub in ast.walk(cls):  # self.x = ..., self.x: T = ..., self.x += ...
        if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
            names.add(sub.attr)
    return names


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}

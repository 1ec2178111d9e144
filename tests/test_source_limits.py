"""The source's size and prose limits (docs/architecture.md, "Limits"): a module of specobs/ holds
at most 600 lines, a function at most 80, a C file at most 1,200; no comment or docstring of the
package, its tests, benchmarks or scripts names a machine, an issue number or a timing measured on
one machine (those live in commit bodies and benchmarks/RESULTS.md). Each check runs on the package
and on a planted violation, so a check that finds nothing still proves it can find something."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

import specobs

PACKAGE = Path(specobs.__file__).parent
MODULE_LINES = 600
FUNCTION_LINES = 80
C_FILE_LINES = 1200

#: A machine named in prose: the device machines and the CI VM.
MACHINE = re.compile(r"\b(?:[AHB]100|H200|GH200|B200|GB200|A10G?|L4|L40S|MI300X?|vCPUs?|CPU VM)\b")
#: An issue or session number.
ISSUE = re.compile(r"\b(?:issues?|PR|session)\s*#?\d+|\b(?:fixed|closed|see|in)\s+#\d+", re.I)
#: A timing with a word that says it was measured somewhere.
TIMING = re.compile(
    r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:µs|us|ms|ns)\b[^.]{0,40}\b(?:measured|benchmark)"
    r"|\b(?:measured|benchmark)\w*\b[^.]{0,40}\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?"
    r"(?:µs|us|ms|ns)\b",
    re.I)


def long_functions(source: str) -> list[tuple[str, int]]:
    """Every function of ``source`` over FUNCTION_LINES, with its length (def to last line)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > FUNCTION_LINES:
                out.append((node.name, n))
    return out


def long_c_functions(source: str) -> list[tuple[str, int]]:
    """Every C function of ``source`` over FUNCTION_LINES: the project's style puts a
    definition's name at column 0 (its return type on the line above) and its closing brace at
    column 0; counted from the name's line to the brace."""
    out, lines = [], source.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"([A-Za-z_]\w*)\(", line)
        if m is None or line.rstrip().endswith(";"):
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "}"), None)
        if end is not None and "{" in "".join(lines[i:end]) and end - i + 1 > FUNCTION_LINES:
            out.append((m.group(1), end - i + 1))
    return out


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a Python or C file, each with its first line."""
    text = path.read_text()
    if path.suffix in (".c", ".h"):
        for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S):
            yield text.count("\n", 0, m.start()) + 1, m.group(0)
        return
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def history_in_prose(path: Path) -> list[str]:
    """``path:line: what`` for every comment or docstring that names a machine, an issue or a
    timing measured on one."""
    return history_in_prose_at(path, PACKAGE.parent)


def history_in_prose_at(path: Path, root: Path) -> list[str]:
    found = []
    for line, text in prose(path):
        flat = " ".join(text.split())
        for what, rx in (("a machine", MACHINE), ("an issue", ISSUE),
                         ("a measured timing", TIMING)):
            m = rx.search(flat)
            if m:
                found.append(f"{path.relative_to(root)}:{line}: {what}: "
                             f"{flat[max(0, m.start() - 40):m.end() + 40]!r}")
    return found


def sources(*suffixes: str) -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in suffixes)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_function_or_c_file_is_over_its_limit() -> None:
    over = [f"{p.relative_to(PACKAGE.parent)}: {lines(p)} lines" for p in sources(".py")
            if lines(p) > MODULE_LINES]
    over += [f"{p.relative_to(PACKAGE.parent)}: {lines(p)} lines" for p in sources(".c", ".h")
             if lines(p) > C_FILE_LINES]
    over += [f"{p.relative_to(PACKAGE.parent)}: {name}() {n} lines" for p in sources(".py")
             for name, n in long_functions(p.read_text())]
    over += [f"{p.relative_to(PACKAGE.parent)}: {name}() {n} lines" for p in sources(".c", ".h")
             for name, n in long_c_functions(p.read_text())]
    assert not over, (f"over the limits (modules {MODULE_LINES}, C files {C_FILE_LINES}, "
                      f"functions {FUNCTION_LINES} lines): {over}")


def test_the_limits_find_what_they_are_for() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", FUNCTION_LINES + 1)]
    assert long_functions(f"def f():\n{body[:-10]}\n") == []
    c_body = "\n".join(f"    x += {i};" for i in range(FUNCTION_LINES - 3))
    assert long_c_functions(f"static int\nf(int x)\n{{\n{c_body}\n}}\n") == []
    assert long_c_functions(f"static int\nf(int x)\n{{\n{c_body}\n    x++;\n}}\n") == [
        ("f", FUNCTION_LINES + 1)]
    assert long_c_functions("static int f(int x);\nint\ng(void);\n") == []


def test_no_comment_or_docstring_carries_history() -> None:
    root = PACKAGE.parent
    rest = [p for d in ("tests", "benchmarks", "scripts")
            for p in sorted((root / d).rglob("*.py"))]
    found = [hit for p in [*sources(".py", ".c", ".h"), *rest] for hit in history_in_prose(p)]
    assert not found, ("comments and docstrings say what and why; machines, issue numbers and "
                       "measured timings belong in commit bodies and benchmarks/RESULTS.md:\n"
                       + "\n".join(found))


@pytest.mark.parametrize(("text", "what"), [
    ("# on the H200 this took longer\n", "a machine"),
    ("# on 2 vCPUs\n", "a machine"),
    ("# see issue 15 for why\n", "an issue"),
    ("# fixed in #51\n", "an issue"),
    ("# a record costs 0.3-50 µs, measured side by side\n", "a measured timing"),
    ('"""The SDK\'s per-span path measured 16 µs a span."""\n', "a measured timing"),
    ("/* the benchmark gave 12 ns a cycle */\n", "a measured timing"),
])
def test_history_in_prose_is_found(tmp_path: Path, text: str, what: str) -> None:
    path = tmp_path / ("x.c" if text.startswith("/*") else "x.py")
    path.write_text(text + "x = 1\n")
    found = history_in_prose_at(path, tmp_path)
    assert len(found) == 1 and f": {what}: " in found[0], found


def test_plain_prose_is_not_flagged(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text('"""Polls every 1 ms; a list of 16 items; the k=4 cycle; a B x (k + 1) '
                    'forward."""\n# the C file keeps the pump (see docs/architecture.md)\n'
                    'x = {"#": 1}\n# grey annotations (#888) and a colour #1f77b4\n')
    assert history_in_prose_at(path, tmp_path) == []

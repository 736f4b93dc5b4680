"""The AST mutator of the mutation score: small changes inside a solution's SOLUTION blocks (issue 20).

`mutate` walks the reference solution's syntax tree and, for each node inside a `# BEGIN SOLUTION ... # END
SOLUTION` block (what a learner writes), makes every change of the kinds in OPERATORS: a flipped comparison, an
off-by-one constant, swapped arguments, a dropped statement... Each change rewrites only that node's characters,
so the rest of the file (comments, layout) stays, and gives a `Mutant`: the whole file, and the changed line
before and after. Grading the mutants and the report are in mutants.py.
"""

from __future__ import annotations

import ast
import copy
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

__all__ = ["OPERATORS", "Mutant", "solution_blocks", "mutate"]

BEGIN = re.compile(r"^\s*# BEGIN SOLUTION(?::.*)?$")  # the markers of course_lib/instructor/exercises.py
END = re.compile(r"^\s*# END SOLUTION\s*$")

OPERATORS = {
    "comparison": "< <-> <=, > <-> >=, == <-> !=, is <-> is not, in <-> not in",
    "arithmetic": "+ <-> -, * <-> /, / <-> //, in expressions and augmented assignments",
    "constant": "an integer constant n -> n + 1 and n - 1",
    "dim": "dim=/axis= k -> the others of 0, 1, -1",
    "swap_args": "two neighbouring positional arguments of a call swapped",
    "drop_statement": "a statement (not a return) replaced by pass",
    "sum_mean": ".sum <-> .mean (methods and torch.sum/torch.mean)",
    "boolean": "and <-> or, True <-> False",
    "remove_not": "not x -> x",
    "return_none": "return x -> return None",
}

_COMPARISONS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_ARITHMETIC = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult, ast.FloorDiv],
               ast.FloorDiv: [ast.Div]}
_DIM_KEYWORDS = {"dim", "axis"}


@dataclass
class Mutant:
    """One small change to a solution: which operator, where, the changed line before and after, the whole file."""

    exercise: str
    number: int  # its place in the exercise's list of every mutant (stable whatever --limit or --operator pick)
    operator: str
    function: str
    line: int
    old: str
    new: str
    source: str = field(repr=False)

    @property
    def name(self) -> str:
        return f"{self.exercise}#{self.number}"

    def diff(self, width: int = 110) -> str:
        def cut(text: str) -> str:
            return text if len(text) <= width else text[: width - 1] + "…"

        return f"-  {cut(self.old)}\n+  {cut(self.new)}"



def solution_blocks(source: str) -> list[tuple[int, int]]:
    """The (first, last) line numbers, 1-based and inclusive, of the code inside each SOLUTION block."""
    blocks, start = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        if BEGIN.match(line):
            start = number + 1
        elif END.match(line) and start is not None:
            blocks.append((start, number - 1))
            start = None
    return blocks


def _int_value(node: ast.AST) -> int | None:
    """The value of an integer literal, -1 included (a unary minus on a constant); None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _int_value(node.operand) is not None:
        return -_int_value(node.operand)
    return None


def _int_node(value: int) -> ast.expr:
    return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _replacements(node: ast.AST, parent: ast.AST | None) -> Iterator[tuple[str, ast.AST]]:
    """Every (operator, replacement node) for one node of the solution."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARISONS:
                new = copy.deepcopy(node)
                new.ops[i] = _COMPARISONS[type(op)]()
                yield "comparison", new
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITHMETIC:
        operands = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.value]
        if not any(_is_text(o) for o in operands):  # "a" + "b" is joining text, not arithmetic
            for op in _ARITHMETIC[type(node.op)]:
                new = copy.deepcopy(node)
                new.op = op()
                yield "arithmetic", new
    value = _int_value(node)
    if value is not None and not (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)):
        if isinstance(parent, ast.keyword) and parent.arg in _DIM_KEYWORDS:
            others = [v for v in (0, 1, -1) if v != value] if value in (0, 1, -1) else [value + 1, value - 1]
            for other in others:
                yield "dim", _int_node(other)
        else:
            for other in (value + 1, value - 1):
                yield "constant", _int_node(other)
    if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
        for i in range(len(node.args) - 1):
            new = copy.deepcopy(node)
            new.args[i], new.args[i + 1] = new.args[i + 1], new.args[i]
            yield "swap_args", new
    if isinstance(node, ast.stmt) and not isinstance(node, (ast.Return, ast.Pass)):
        if not (isinstance(node, ast.Expr) and _is_text(node.value)):
            yield "drop_statement", ast.Pass()
    if isinstance(node, ast.Attribute) and node.attr in ("sum", "mean"):
        new = copy.deepcopy(node)
        new.attr = "mean" if node.attr == "sum" else "sum"
        yield "sum_mean", new
    if isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "boolean", new
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "boolean", ast.Constant(not node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "remove_not", copy.deepcopy(node.operand)
    if isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        yield "return_none", ast.Return(ast.Constant(None))


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, str, bool]]:
    """(node, parent, enclosing function's qualified name, inside an f-string) for every node, in a fixed order."""
    def visit(node, parent, scope, in_text):
        yield node, parent, scope, in_text
        inner = scope
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{scope}.{node.name}" if scope else node.name
        for child in ast.iter_child_nodes(node):
            yield from visit(child, node, inner, in_text or isinstance(node, ast.JoinedStr))

    yield from visit(tree, None, "", False)


def _offset(lines: list[str], line: int, column: int) -> int:
    """The character offset of (1-based line, UTF-8 byte column) in the text split into `lines` (with ends)."""
    before = sum(len(text) for text in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:column].decode())


def _swapped(parent: ast.AST, node: ast.AST, replacement: ast.AST) -> Callable[[], None]:
    """Put `replacement` where `node` is in `parent`, in place; return what puts `node` back."""
    for name, value in ast.iter_fields(parent):
        if value is node:
            setattr(parent, name, replacement)
            return lambda: setattr(parent, name, node)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is node:
                    value[i] = replacement
                    return lambda: value.__setitem__(i, node)
    raise ValueError("the node is not a child of its parent")


def _rewritten(source: str, tree: ast.Module, top: int, parent: ast.AST, node: ast.AST, replacement: ast.AST,
               start: int, stop: int) -> tuple[str, str, str] | None:
    """`source` with `node`'s characters (`start` to `stop`) replaced by the text of `replacement`, parenthesised
    where it must be for the result to parse as the tree meant: (the new source, the text put in, the dump of
    module-level statement `top` in it); None where neither text parses as meant."""
    put_back = _swapped(parent, node, replacement)
    wanted = ast.dump(tree.body[top])
    put_back()
    text = ast.unparse(replacement)
    if source.startswith("elif", start) and isinstance(parent, ast.If):  # dropping an elif: else: pass
        text = f"else:\n{' ' * parent.body[0].col_offset}{text}"
    for candidate in (text, f"({text})") if isinstance(node, ast.expr) else (text,):
        mutated = source[:start] + candidate + source[stop:]
        try:
            body = ast.parse(mutated).body
        except SyntaxError:
            continue
        got = ast.dump(body[top]) if len(body) == len(tree.body) else None
        if got == wanted:
            return mutated, candidate, got
    return None


def mutate(source: str, exercise: str = "ex") -> tuple[list[Mutant], Counter]:
    """Every mutant of `source` made inside its SOLUTION blocks, and a count of those skipped and why.

    Each mutant's text is the solution with only the mutated node's characters changed, so comments and
    layout stay; it must compile, and it must parse to a tree that differs from the solution's (swapping
    two equal arguments changes nothing) and equals the intended one (else parentheses were needed and
    are tried, or the mutant is skipped).
    """
    tree = ast.parse(source)
    blocks = solution_blocks(source)
    lines = source.splitlines(keepends=True)
    made: list[Mutant] = []
    skipped: Counter = Counter()
    seen: set[str] = set()
    originals: dict[int, str] = {}  # the dump of each module-level statement
    for node, parent, scope, in_text in _walk(tree):
        if in_text or not hasattr(node, "lineno") or isinstance(node, ast.keyword):
            continue
        if not any(first <= node.lineno and node.end_lineno <= last for first, last in blocks):
            continue
        # Only the node's characters change, so comparing the module-level statement around it is enough.
        top = next(i for i, stmt in enumerate(tree.body) if stmt.lineno <= node.lineno <= stmt.end_lineno)
        if top not in originals:
            originals[top] = ast.dump(tree.body[top])
        original = originals[top]
        start = _offset(lines, node.lineno, node.col_offset)
        stop = _offset(lines, node.end_lineno, node.end_col_offset)
        for operator, replacement in _replacements(node, parent):
            rewritten = _rewritten(source, tree, top, parent, node, replacement, start, stop)
            if rewritten is None:
                skipped[f"{operator}: does not parse as meant"] += 1
                continue
            mutated, candidate, got = rewritten
            if got == original:
                skipped[f"{operator}: the same program"] += 1
                continue
            if mutated in seen:
                skipped[f"{operator}: the same as another mutant"] += 1
                continue
            try:
                compile(mutated, f"{exercise}.py", "exec")
            except SyntaxError:  # parses, but e.g. a return outside a function
                skipped[f"{operator}: does not compile"] += 1
                continue
            seen.add(mutated)
            new_lines = mutated.splitlines()
            old = lines[node.lineno - 1].strip() + (" …" if node.end_lineno > node.lineno else "")
            new = " ".join(line.strip() for line in new_lines[node.lineno - 1: node.lineno + candidate.count("\n")])
            made.append(Mutant(exercise, len(made), operator, scope or "<module>", node.lineno, old, new, mutated))
    return made, skipped

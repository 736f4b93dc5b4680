"""Make the exercise stubs from the reference solutions, the single source (notebook 00).

In solutions/exNN_topic.py a solution block is marked like this:

    def total_bytes(model):
        \"\"\"Docstring: the contract, kept in the stub.\"\"\"
        # BEGIN SOLUTION: add up numel() * element_size() over model.parameters()
        return sum(p.numel() * p.element_size() for p in model.parameters())
        # END SOLUTION

and in exercises/exNN_topic.py it becomes

        raise NotImplementedError("add up numel() * element_size() over model.parameters()")

    python -m course_lib.exercises           write exercises/ from solutions/ (edited files are backed up first)
    python -m course_lib.exercises --check   exit 1 if exercises/ is out of date

It also writes course_lib/grading/stub_hints.json, every stub's hint by exercise: the graded tests' runner
tells an untouched stub's NotImplementedError (its message is one of these) from any other (notebook 00).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from course_lib.grading.runner import STUB_HINTS
from course_lib.paths import EXERCISES, SOLUTIONS

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?::\s*(?P<hint>.*?))?\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HEADER = (
    "# Exercise file: replace each `raise NotImplementedError(...)` with your code,\n"
    "# then run `check(\"{name}\")` in the notebook (or `python3 course.py check {name}`).\n"
)


class StubError(ValueError):
    """A solution file whose markers do not pair up."""


def make_stub(source: str, name: str) -> str:
    """The exercise stub for one solution file's text (notebook 00)."""
    out, inside, line_no = [], None, 0
    for line_no, line in enumerate(source.splitlines(keepends=True), 1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if inside is not None:
                raise StubError(f"{name}:{line_no}: BEGIN SOLUTION inside the block opened at line {inside}")
            inside = line_no
            hint = begin["hint"] or "write this part"
            out.append(f"{begin['indent']}raise NotImplementedError({hint!r})\n")
        elif end:
            if inside is None:
                raise StubError(f"{name}:{line_no}: END SOLUTION with no BEGIN SOLUTION before it")
            inside = None
        elif inside is None:
            out.append(line)
    if inside is not None:
        raise StubError(f"{name}:{inside}: BEGIN SOLUTION is never closed by END SOLUTION")
    text = "".join(out)
    if "NotImplementedError" not in text:
        raise StubError(f"{name}: no '# BEGIN SOLUTION' block, so the stub would be the solution")
    return HEADER.format(name=name.split("_")[0]) + text


def expected_stubs(solutions: Path = SOLUTIONS) -> dict[str, str]:
    """File name -> stub text, for every solutions/ex*.py (notebook 00)."""
    return {p.name: make_stub(p.read_text(), p.stem) for p in sorted(solutions.glob("ex*.py"))}


def stub_hints(solutions: Path = SOLUTIONS) -> dict[str, list[str]]:
    """{"ex05": [hint, ...]}: the message of every `raise NotImplementedError(...)` in the stubs, by exercise."""
    hints: dict[str, list[str]] = {}
    for path in sorted(solutions.glob("ex*.py")):
        found = [begin["hint"] or "write this part" for begin in map(BEGIN.match, path.read_text().splitlines())
                 if begin]
        hints.setdefault(path.stem.split("_")[0], []).extend(found)
    return hints


def stub_hints_text(solutions: Path = SOLUTIONS) -> str:
    """STUB_HINTS's contents for these solutions."""
    return json.dumps(stub_hints(solutions), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.exercises", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS)
    parser.add_argument("--exercises", type=Path, default=EXERCISES)
    parser.add_argument("--hints", type=Path, default=None,
                        help=f"where to write the stubs' hints (default: {STUB_HINTS.relative_to(SOLUTIONS.parent)}, "
                             "for the course's own solutions/; none for other --solutions)")
    options = parser.parse_args(argv)
    try:
        stubs = expected_stubs(options.solutions)
    except StubError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stale = [n for n, text in stubs.items()
             if not (options.exercises / n).exists() or (options.exercises / n).read_text() != text]
    if options.hints is None and options.solutions.resolve() == SOLUTIONS.resolve():
        options.hints = STUB_HINTS
    hints = stub_hints_text(options.solutions) if options.hints is not None else ""
    hints_stale = options.hints is not None and (
        not options.hints.is_file() or options.hints.read_text(encoding="utf-8") != hints)
    if options.check:
        for name in stale:
            print(f"out of date: exercises/{name} (run: python -m course_lib.exercises)")
        if hints_stale:
            print(f"out of date: {options.hints.name} (run: python -m course_lib.exercises)")
        return 1 if stale or hints_stale else 0
    if hints_stale:
        options.hints.write_text(hints, encoding="utf-8")
        print(f"wrote {options.hints.name}")
    options.exercises.mkdir(exist_ok=True)
    for name in stale:
        path = options.exercises / name
        if path.exists():  # never lose a learner's work: keep a copy of what is replaced
            backup = options.exercises / ".backup" / f"{path.stem}.{time.strftime('%Y%m%d-%H%M%S')}.py"
            backup.parent.mkdir(exist_ok=True)
            shutil.copy2(path, backup)
            print(f"backed up exercises/{name} to {backup.relative_to(options.exercises.parent)}")
        path.write_text(stubs[name])
        print(f"wrote exercises/{name}")
    if not stale:
        print("exercises/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

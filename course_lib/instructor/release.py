"""Make the student release: the course without solutions/, with fresh exercise stubs (the instructor's tool).

    python3 course.py release OUT [--zip] [--allow-leaks]      (python -m course_lib.instructor.release)

Like nbgrader's `generate_assignment`: copies the course's files (those git tracks, or every file when there is
no git) into OUT, leaving out what is the instructor's: solutions/ (with the wrong answers), the grader and the
other instructor's tools (course_lib/instructor/, course_lib/grade.py, course_lib/exercises.py), the course's own
tests (tests/course/; the graded tests tests/test_exNN_*.py ship, as `check` runs them), benchmarks/ (they time
the solutions), docs/, .ci/ and build leftovers. Writes exercises/ afresh from solutions/ (so an instructor's own
attempts in exercises/ never ship), and a learner's README.md (learner_README.md beside this file) in place of
the repository's. Writes every notebook in its clean form (`clean_notebook`: the form the lessons are committed
in, which tests/course/notebooks checks), whatever the working tree holds (a notebook opened in JupyterLab, or
run, carries outputs, execution counts, the kernel's language_info and cell timings), and says what it cleared; a
notebook that is already clean is copied byte for byte. Then checks that no solution block appears anywhere in
the release (a notebook or a test that quotes the answer) and refuses if one does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from course_lib.instructor.exercises import BEGIN, END, expected_stubs

from course_lib.paths import ROOT

__all__ = ["make_release", "solution_blocks", "find_leaks", "clean_notebook", "write_notebook"]

LEFT_OUT = {"solutions", "benchmarks", ".ci", ".git", ".venv", "exercises", "grades", "release", "build", "docs"}
# The instructor's and the course developers' files below the top level: the grader, the stub maker, the
# self-checks, and the tests of the course itself (which grade the solutions and read the repository's README).
LEFT_OUT_PATHS = ("course_lib/instructor", "course_lib/grade.py", "course_lib/exercises.py", "tests/course",
                  "tests/conftest.py")
LEARNER_README = Path(__file__).with_name("learner_README.md")  # the release's README.md
LEFT_OUT_SUFFIXES = (".pyc", ".egg-info")
MIN_LEAK_CHARS = 40  # shorter blocks (one `return x`) match too much by chance

# A clean notebook's metadata, as every lesson is committed: the kernel every learner has (JupyterLab writes the
# running kernel's spec over it, which may be an instructor's own), and of language_info only the name (a kernel
# adds its Python version, mimetype, lexer...). Every other notebook-level key goes (ipywidgets' saved widget state,
# an editor's or extension's settings).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"name": "python"}
# Cell metadata that running or viewing a cell writes: JupyterLab's recordTiming (`execution`), a scrolled or
# collapsed output, collapsed headings, jupyter_contrib's ExecuteTime, papermill's, VS Code's and PyCharm's
# bookkeeping. An author's keys stay (`tags`, `editable`, `deletable`, `slideshow`, a hidden cell's
# `jupyter.source_hidden`); the lessons use no cell metadata today.
TRANSIENT_CELL_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime", "heading_collapsed", "hidden",
                           "jp-MarkdownHeadingCollapsed", "papermill", "vscode", "pycharm", "trusted")


def _course_files(root: Path) -> list[Path]:
    """Files of the course, relative to root: git's list where there is one, else a walk."""
    if (root / ".git").exists() and shutil.which("git"):
        done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                              cwd=root, capture_output=True)
        if done.returncode == 0:
            return sorted({Path(p) for p in done.stdout.decode().split("\0") if p and (root / p).is_file()})
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in {"__pycache__", ".ipynb_checkpoints"} and not d.endswith(".egg-info")
                   and not (Path(folder) == root and d in LEFT_OUT)]
        found += [Path(folder, f).relative_to(root) for f in files]
    return sorted(found)


def _released(path: Path) -> bool:
    if path.parts[0] in LEFT_OUT or any(part == "__pycache__" for part in path.parts):
        return False
    if path == Path("README.md") or any(path == Path(p) or Path(p) in path.parents for p in LEFT_OUT_PATHS):
        return False
    return not any(part.endswith(LEFT_OUT_SUFFIXES) for part in path.parts)


def solution_blocks(solutions: Path) -> list[tuple[str, str]]:
    """(file name, normalised text) of every `# BEGIN SOLUTION` … `# END SOLUTION` block."""
    blocks = []
    for path in sorted(solutions.glob("ex*.py")):
        inside = None
        for line in path.read_text().splitlines():
            if BEGIN.match(line):
                inside = []
            elif END.match(line) and inside is not None:
                blocks.append((path.name, _normalise("\n".join(inside))))
                inside = None
            elif inside is not None:
                inside.append(line)
    return [(name, text) for name, text in blocks if len(text) >= MIN_LEAK_CHARS]


def _normalise(text: str) -> str:
    """Lines stripped, without blank lines, comment lines or trailing comments: what a copy keeps."""
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("#"))


def _text_of(path: Path) -> str | None:
    try:
        raw = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(raw).get("cells", [])
            raw = "\n".join("".join(c.get("source", "")) if isinstance(c.get("source"), list) else str(c.get("source", ""))
                            for c in cells)
        except (ValueError, AttributeError):
            pass
    return _normalise(raw)


def clean_notebook(notebook: nbformat.NotebookNode) -> list[str]:
    """Clear, in place, what running or opening a notebook adds (outputs, execution counts, kernel metadata,
    cell timings, widget state); return what was cleared, in words, e.g. ["outputs of 5 cells", "kernel metadata"]
    ([] for a clean notebook)."""
    outputs = counts = 0
    cell_keys: dict[str, int] = {}
    for cell in notebook.cells:
        if cell.get("cell_type") == "code":
            outputs += bool(cell.get("outputs"))
            counts += cell.get("execution_count") is not None
            cell["outputs"], cell["execution_count"] = [], None
        metadata = cell.setdefault("metadata", nbformat.NotebookNode())
        dropped = [key for key in TRANSIENT_CELL_METADATA if key in metadata]
        if isinstance(metadata.get("jupyter"), dict) and "outputs_hidden" in metadata["jupyter"]:
            dropped.append("jupyter.outputs_hidden")
            del metadata["jupyter"]["outputs_hidden"]
            if not metadata["jupyter"]:
                del metadata["jupyter"]
        for key in dropped:
            metadata.pop(key, None)
            cell_keys[key] = cell_keys.get(key, 0) + 1
    cleared = [f"outputs of {outputs} cell{'s' * (outputs != 1)}"] if outputs else []
    cleared += [f"{counts} execution count{'s' * (counts != 1)}"] if counts else []
    metadata = notebook.setdefault("metadata", nbformat.NotebookNode())
    if metadata.get("kernelspec") != KERNELSPEC or metadata.get("language_info") != LANGUAGE_INFO:
        cleared.append("kernel metadata")
    others = sorted(key for key in metadata if key not in ("kernelspec", "language_info"))
    cleared += [f"notebook metadata {', '.join(others)}"] if others else []
    cleared += [f"cell metadata {key} ({cell_keys[key]} cell{'s' * (cell_keys[key] != 1)})"
                for key in (*TRANSIENT_CELL_METADATA, "jupyter.outputs_hidden") if key in cell_keys]
    notebook["metadata"] = nbformat.from_dict({"kernelspec": KERNELSPEC, "language_info": LANGUAGE_INFO})
    return cleared


def write_notebook(notebook: nbformat.NotebookNode, path: Path) -> None:
    """Write in the layout of the repository's notebooks (JupyterLab's: nbformat's JSON, indent 1, sorted keys,
    a newline at the end)."""
    nbformat.write(notebook, str(path))


def _release_notebook(source: Path, target: Path) -> list[str]:
    """Copy a notebook into the release in its clean form; return what was cleared ([]: copied byte for byte)."""
    try:
        notebook = nbformat.read(str(source), as_version=4)
    except Exception as error:  # not JSON, or not a notebook nbformat knows
        raise ValueError(f"not a notebook nbformat can read ({type(error).__name__}: {error})") from error
    cleared = clean_notebook(notebook)
    if cleared:
        write_notebook(notebook, target)
    else:
        shutil.copy2(source, target)
    return cleared


def _notebooks_line(cleared: dict[Path, list[str]]) -> str:
    """The one line `release` prints about the notebooks."""
    dirty = {path: what for path, what in cleared.items() if what}
    names = {path: path.name if path.parent == Path("notebooks") else path.as_posix() for path in dirty}
    line = f"notebooks: outputs, execution counts and kernel metadata cleared in {len(dirty)} of {len(cleared)}"
    if dirty:
        return line + " (" + "; ".join(f"{names[p]}: {', '.join(what)}" for p, what in dirty.items()) + ")"
    return line + (" (all were clean)" if cleared else "")


def find_leaks(folder: Path, blocks: list[tuple[str, str]]) -> list[str]:
    """Files in `folder` that contain a solution block, or a solution marker."""
    leaks = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        text = _text_of(path)
        if text is None:
            continue
        relative = path.relative_to(folder)
        if relative.parts[0] == "exercises" and "# BEGIN SOLUTION" in path.read_text(errors="replace"):
            leaks.append(f"{relative}: contains a '# BEGIN SOLUTION' marker")
        for name, block in blocks:
            if block in text:
                leaks.append(f"{relative}: contains a solution block of solutions/{name}: {block.splitlines()[0][:60]}…")
    return leaks


def make_release(out: Path, root: Path = ROOT, allow_leaks: bool = False) -> list[Path]:
    """Write the student release into `out` (which must not exist or be empty); return the files written."""
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: {out} is a file; choose a new folder")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty; choose a new folder")
    if root.resolve() in [out, *out.parents] and out.relative_to(root.resolve()).parts[0] not in LEFT_OUT:
        raise SystemExit(f"error: put the release outside the course folder (or in release/), not {out}")
    stubs = expected_stubs(root / "solutions")
    if not stubs:
        raise SystemExit(f"error: no solutions/ex*.py in {root}: nothing to make stubs from")
    written, cleared = [], {}
    for relative in _course_files(root):
        if not _released(relative):
            continue
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative.suffix == ".ipynb":
            try:
                cleared[relative] = _release_notebook(root / relative, target)
            except ValueError as error:
                shutil.rmtree(out)
                raise SystemExit(f"error: release not made: {relative} is {error}") from error
        else:
            shutil.copy2(root / relative, target)
        written.append(relative)
    print(_notebooks_line(cleared))
    (out / "README.md").write_text(LEARNER_README.read_text(encoding="utf-8"), encoding="utf-8")
    written.append(Path("README.md"))
    (out / "exercises").mkdir(parents=True, exist_ok=True)
    for name, text in stubs.items():
        (out / "exercises" / name).write_text(text)
        written.append(Path("exercises") / name)
    leaks = find_leaks(out, solution_blocks(root / "solutions"))
    if leaks:
        print("The release would give away solutions:", *(f"  {leak}" for leak in leaks), sep="\n", file=sys.stderr)
        if not allow_leaks:
            shutil.rmtree(out)
            raise SystemExit("error: release not made (fix the files above, or pass --allow-leaks)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 course.py release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to create, e.g. ../course-2026-students")
    parser.add_argument("--zip", action="store_true", help="also write OUT.zip")
    parser.add_argument("--allow-leaks", action="store_true", help="release even if a solution block is found")
    options = parser.parse_args(argv)
    written = make_release(options.out, allow_leaks=options.allow_leaks)
    print(f"wrote the student release to {options.out.resolve()}: {len(written)} files, "
          f"{sum(1 for p in written if p.parts[0] == 'exercises')} exercise stubs and a learner's README.md; "
          "no solutions/, wrong answers or grader")
    if options.zip:
        archive = shutil.make_archive(str(options.out.resolve()), "zip", options.out.resolve().parent,
                                      options.out.resolve().name)
        print(f"and {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

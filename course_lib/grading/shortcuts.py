"""Shortcuts switched off in the child while an exercise is graded: torch's or the course's own version of what the
learner is asked to write refuses to run (graded tests of exercises 07 and 08).

    from course_lib.grading.shortcuts import defined_in, replace, switch_off_shortcuts

    _refuser = refuser_for("07", "what to write instead")   # _refuser(label): a function that refuses to run

    def _switcher(fullname):                  # which modules to switch off, and how (None: leave it alone)
        if fullname == "torch.distributed.pipelining.schedules":
            return _switch_off_schedules      # (module, replaced) -> None, calling replace(...) for each name
        return lesson_module_switch(fullname, LESSON_MODULES, _refuser)   # the lesson's own new modules

    def _driver(module, cases):
        switch_off_shortcuts(module, _switcher, _refuser)   # first thing in the child
        ...

Modules already imported are switched off at once; the others as they are imported, by an import hook, so that
learner code that never imports them does not pay for importing them. Names the learner's file imported before
(`from torch.distributed.fsdp import fully_shard`) are pointed at the refusing versions too. torch's functional
collectives are always switched off: they would bypass the tests' log of collectives.
"""

from __future__ import annotations

import importlib.abc
import inspect
import sys
from collections.abc import Callable
from functools import partial

__all__ = ["defined_in", "replace", "refuser_for", "lesson_module_switch", "switch_off_shortcuts",
           "FUNCTIONAL_COLLECTIVES"]

FUNCTIONAL_COLLECTIVES = ("all_reduce", "all_reduce_inplace", "all_reduce_coalesced", "all_gather_tensor",
                          "all_gather_tensor_autograd", "all_gather_tensor_inplace",
                          "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
                          "reduce_scatter_tensor_autograd", "reduce_scatter_tensor_coalesced", "all_to_all_single",
                          "all_to_all_single_autograd", "broadcast", "permute_tensor")


def defined_in(module) -> list[tuple[str, object]]:
    """The functions and classes a module defines itself, or a package in its own files (not the ones it imports
    from elsewhere): `course_lib.parallel.pipeline` re-exports what `pipeline/schedules.py` defines."""
    home = module.__name__
    return [(name, value) for name, value in list(vars(module).items())
            if not name.startswith("__") and (inspect.isfunction(value) or inspect.isclass(value))
            and _is_within(getattr(value, "__module__", None), home)]


def _is_within(name: str | None, home: str) -> bool:
    return isinstance(name, str) and (name == home or name.startswith(home + "."))


def replace(module, name: str, refuser: Callable, replaced: list) -> None:
    """module.name is `refuser` from now on; `replaced` remembers (original, refuser) to fix names imported before."""
    replaced.append((getattr(module, name), refuser))
    setattr(module, name, refuser)


def refuser_for(exercise: str, advice: str) -> Callable[[str], Callable]:
    """An exercise's refuser: refuser(label) makes a function that raises RuntimeError, saying that `label` is
    switched off while the exercise is graded and what to write instead (`advice`, in parentheses)."""
    def refuser(label: str) -> Callable:
        def refused(*args, **kwargs):
            raise RuntimeError(f"{label} is switched off while exercise {exercise} is graded: write this piece "
                               f"yourself ({advice})")
        return refused
    return refuser


def lesson_module_switch(fullname: str, allowed: tuple[str, ...], refuser: Callable) -> Callable | None:
    """The switch for a new course_lib.parallel module or package, and each module inside such a package (one not in
    `allowed`, the earlier lessons' modules): all of it refuses to run. None for any other module."""
    parts = fullname.split(".")
    if len(parts) >= 3 and parts[:2] == ["course_lib", "parallel"] and parts[2] not in allowed:
        return partial(_switch_off_lesson_module, refuser=refuser)
    return None


def _switch_off_lesson_module(module, replaced: list, refuser: Callable) -> None:
    """A new course_lib.parallel module (the lesson's own code): every function and class it defines refuses."""
    for name, _ in defined_in(module):
        replace(module, name, refuser(f"{module.__name__}.{name} (the lesson's own code)"), replaced)


def switch_off_shortcuts(learner, switcher: Callable, refuser: Callable[[str], Callable]) -> None:
    """In the child: every module `switcher(fullname)` names is switched off, now or when it is imported.

    switcher(fullname) returns None or a function switch(module, replaced) that switches the module's shortcuts off
    (with `replace`); refuser(label) makes the function that raises, saying what to write instead.
    """
    import torch.distributed._functional_collectives as funcol

    replaced: list = []
    for name in FUNCTIONAL_COLLECTIVES:
        if hasattr(funcol, name):
            replace(funcol, name, refuser(f"torch's functional collective {name}"), replaced)
    for fullname in _chosen_by(switcher):
        switch, module = switcher(fullname), sys.modules.get(fullname)
        if switch is not None and module is not None:
            switch(module, replaced)
    for name, value in list(vars(learner).items()):
        for original, refusing in replaced:
            if value is original:
                setattr(learner, name, refusing)
    if not any(isinstance(finder, _SwitchOffOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SwitchOffOnImport(switcher))


# The modules a switcher chose among those imported, by the switcher's name: a kept rank runs the same driver again
# and again (course_lib.dist.warm), a new copy of its switcher each time, over the same 2,000 modules (4 ms a run).
_chosen: dict[tuple, tuple[tuple, list[str]]] = {}


def _chosen_by(switcher: Callable) -> list[str]:
    """The imported modules `switcher` switches off, by name (asked again only when sys.modules changed)."""
    names = tuple(sys.modules)
    key = (getattr(switcher, "__module__", None), getattr(switcher, "__qualname__", None))
    seen = _chosen.get(key)
    if seen is not None and seen[0] == names:
        return seen[1]
    chosen = [name for name in names if switcher(name) is not None]
    _chosen[key] = (names, chosen)
    return chosen


class _SwitchOffOnImport(importlib.abc.MetaPathFinder):
    """Finds a module as the other finders would, and switches it off right after it has run."""

    def __init__(self, switcher: Callable):
        self.switcher = switcher

    def find_spec(self, fullname, path, target=None):
        switch = self.switcher(fullname)
        if switch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            original = loader.exec_module

            def exec_module(module):
                original(module)
                switch(module, [])

            loader.exec_module = exec_module
        return spec

"""What a kept rank puts back between runs, so that each run starts as it would in a new rank (course_lib.dist.warm).

Before every further run: the random generators (torch's, Python's, NumPy's), the default dtype, grad mode,
torch's threads and the working folder. Before the first run of another test, also what that test's code replaced
in torch's and the course's modules and in the classes tests count or refuse calls of (a graded test's driver
switches the lesson's shortcuts off: course_lib.grading.shortcuts), the import hooks, sys.path, the environment,
and the course's modules imported since (imported again when next asked for). What cannot be put back, a thread or
a child process a run left running, `clean()` reports: the rank then sends its result and stops serving.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import types

import torch
import torch.distributed as dist

_MISSING = object()


def _watched(name: str) -> bool:
    """The modules whose names a run may rebind (about 1,100 once the fork server's preloads are in: 5 ms to copy)."""
    return name == "torch" or name.startswith(("torch.", "course_lib."))


# The classes whose methods a test or a learner may rebind (to count calls, or to refuse a shortcut: exercise 05's
# tests switch torch's DistributedDataParallel.__init__ off), by the module that defines them: about 800 classes,
# 21 ms to copy once per kept rank, 3 ms to compare at each test's first run.
_CLASS_HOMES = ("torch.nn", "torch.optim", "torch.distributed", "torch.amp", "torch.autograd", "torch.cuda",
                "torch.utils.data", "course_lib")


def _classes(modules) -> list[type]:
    found = {torch.Tensor: None, torch._C.TensorBase: None}
    for module in modules:
        for value in list(vars(module).values()):
            # issubclass(type(value), type), not isinstance(value, type): isinstance reads value.__class__, which a
            # deprecated name (torch.distributed.reduce_op) answers with a warning.
            if issubclass(type(value), type) and str(vars(value).get("__module__", "")).startswith(_CLASS_HOMES):
                found[value] = None
    return list(found)


def _is_code(value) -> bool:
    """A function, method, class or descriptor: what a test or a learner rebinds to patch something (torch's own state, its
    counters, caches and registries, is data, and stays as torch left it: putting that back breaks torch)."""
    # type(value), never isinstance(value, ...): isinstance reads value.__class__, which a deprecated name
    # (torch.distributed.reduce_op) answers with a FutureWarning; callable() reads only the type.
    kind = type(value)
    return (callable(value) and not issubclass(kind, types.ModuleType)) or issubclass(
        kind, (property, classmethod, staticmethod))


def _code_of(namespace) -> tuple[set, dict, list]:
    """Every name a namespace has, the functions and classes among its values, and all its values in order."""
    return set(namespace), {k: v for k, v in namespace.items() if _is_code(v)}, list(namespace.values())


def _unchanged(namespace, values: list) -> bool:
    """Whether the namespace holds the same values in the same order: one list comparison in C, which finds each
    unchanged value by identity (55,000 values in 1,900 namespaces: 2.5-4.5 ms, against 12 ms for the loops of
    _put_back; `all(map(operator.is_, ...))` took 9 ms). A value that is not the same object is compared with its
    own ==: where that fails, the namespace counts as changed; where it answers True (an object made to equal
    anything), the rebinding stays. Only learner code can bind such an object, and a learner's file runs again at
    every run anyway, so it gains nothing it could not do each time. "The same object under a name added last, in
    place of one deleted last" also passes unseen (an alias, harmless)."""
    try:
        return list(namespace.values()) == values
    except Exception:  # noqa: BLE001 - a tensor's ==, a NumPy array's: not the same, then
        return False


def _put_back(namespace, saved: tuple[set, dict, list], set_item) -> None:
    """Rebind the functions and classes rebound since, delete those added under new names since (a submodule
    imported since stays: a later `import torch.x` finds it in sys.modules and would not set the attribute again)."""
    names, code, values = saved
    if _unchanged(namespace, values):
        return
    for name in [n for n, v in namespace.items() if n not in names and _is_code(v)]:
        set_item(name, _MISSING)
    for name, value in code.items():
        if namespace.get(name, _MISSING) is not value:
            set_item(name, value)


def _module_setter(module):
    def set_item(name, value):
        if value is _MISSING:
            del vars(module)[name]
        else:
            vars(module)[name] = value
    return set_item


def _class_setter(cls):
    def set_item(name, value):
        if value is _MISSING:
            delattr(cls, name)
        else:
            setattr(cls, name, value)
    return set_item


def _children() -> list[str]:
    """This process's child processes (Linux; elsewhere none are seen)."""
    found = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as handle:
                found += handle.read().split()
    except OSError:
        pass
    return found


def _record() -> tuple[dict, dict]:
    """Every watched module's functions and classes, and the watched classes' methods, as they are now."""
    modules = {name: (module, _code_of(vars(module))) for name, module in list(sys.modules.items())
               if module is not None and _watched(name)}
    classes = {cls: _code_of(vars(cls)) for cls in _classes(m for m, _ in modules.values())}
    return modules, classes


# Recorded once per process, when this module is first imported: the fork server imports it after all its preloads
# (course_lib.dist.forkserver), so the 25 ms this takes is spent once, not in each kept rank; a rank forked from
# elsewhere imports it at its first run and records then.
_RECORDED = _record()
# And what is loaded so far moves to the garbage collector's permanent generation: a rank's full collections then no
# longer walk the ~200,000 objects of torch and the preloads (shared with the fork server; walking them also copies
# their pages). Not measured in the ranks alone; in pytest's process the same freeze cut collections 1.6 to 1.2 s.
gc.freeze()


class FreshState:
    """A rank's state before its first run; restore() puts it back, clean() says whether it can be."""

    def __init__(self, threads: int):
        self.threads = threads
        self.torch_rng = torch.get_rng_state()
        self.python_rng = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_rng = numpy.random.get_state() if numpy is not None else None
        self.dtype = torch.get_default_dtype()
        self.cwd = os.getcwd()
        self.modules, self.classes = _RECORDED
        self.meta_path, self.path, self.environ = list(sys.meta_path), list(sys.path), dict(os.environ)
        self.python_threads = threading.active_count()

    def restore(self, new_test: bool = False) -> None:
        """Before a further run; `new_test`: the run is another test's, so the modules are put back too."""
        torch.set_rng_state(self.torch_rng)
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            sys.modules["numpy"].random.set_state(self.numpy_rng)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(True)
        torch.set_num_threads(self.threads)
        os.chdir(self.cwd)
        if torch.cuda.is_initialized():  # only a run can have initialised CUDA (a rank is forked before): GPU 0, its
            torch.cuda.set_device(0)  # default stream, as a new rank starts (unverified: no GPU on the course's CI)
            torch.cuda.set_stream(torch.cuda.default_stream())
        if new_test:
            self._restore_modules()

    def _restore_modules(self) -> None:
        for name in [n for n in sys.modules if n.startswith("course_lib.") and n not in self.modules]:
            del sys.modules[name]  # imported (and perhaps switched off) by the last test: imported anew if asked
        for name, (module, saved) in self.modules.items():
            sys.modules[name] = module
            _put_back(vars(module), saved, _module_setter(module))
        for cls, saved in self.classes.items():
            _put_back(vars(cls), saved, _class_setter(cls))
        sys.meta_path[:] = self.meta_path
        sys.path[:] = self.path
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)

    def clean(self) -> bool:
        """Whether the last run left no Python thread and no child process running."""
        return threading.active_count() <= self.python_threads and not _children()

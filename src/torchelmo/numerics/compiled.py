"""Loops fused by ``torch.compile`` (Inductor's C++ code on the CPU), each with eager twin ops.

Inductor needs a C++ compiler at run time: where none is found (:func:`compiler_found`), callers
keep their eager ops, and a compile that fails warns once (:class:`CompileWarning`), after which
that loop (and only that one) runs eager in this process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import warn


@functools.lru_cache(maxsize=1)
def compiler_found() -> bool:
    """Whether the C++ compiler Inductor calls is on this machine (``$CXX``, else g++/c++/clang++);
    looked up once, not on every call."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return any(shutil.which(name) for name in names)


class CompileWarning(UserWarning):
    """``torch.compile`` failed; the eager ops run instead."""


# The loops (by the name run() is given) whose compile failed in this process: they run eager.
_failed: set[str] = set()


def usable(what: str | None = None) -> bool:
    """Whether compiled loops run here (a compiler is found), and, for the loop named ``what``,
    whether its compile has not failed."""
    return compiler_found() and what not in _failed


# A graph per shape, operand type and path: more than Dynamo's default 8 in a process that runs
# several models; past the limit it raises instead of running eager.
_SETTINGS = {"recompile_limit": 64, "fail_on_recompile_limit_hit": True}


def settings() -> contextlib.AbstractContextManager:
    """Dynamo's settings for these loops, as a context manager: entered once around a loop of many
    compiled calls, it spares each call entering them (about 30 us, against a few-hundred-us loop).
    Dynamo's configuration is per thread (context variables), like this scope. Nothing to set where
    compiled loops cannot run."""
    return torch._dynamo.config.patch(**_SETTINGS) if usable() else contextlib.nullcontext()


def _in_settings() -> bool:
    config = torch._dynamo.config
    return config.fail_on_recompile_limit_hit and config.recompile_limit >= _SETTINGS["recompile_limit"]


# Threads read at run time (omp_get_max_threads), so torch.set_num_threads holds after a compile.
# Multiply-adds contracted to FMA instructions (Inductor's default keeps them apart): the gate
# loops are mostly polynomials (benchmarks/cpu_loops.py measures the difference).
_OPTIONS = {"cpp.dynamic_threads": True, "cpp.enable_floating_point_contract_flag": "fast"}


_TORCH_OWN_DEPRECATION = r"`torch\.jit\.script_method` is deprecated"


@functools.cache
def _compile(fn):
    return torch.compile(fn, dynamic=False, options=_OPTIONS)


def run(fn: Callable, args: tuple, eager: Callable[[], Any], dynamic: Sequence[tuple[torch.Tensor, int]],
        what: str) -> Any:
    """``fn(*args)`` compiled, the ``(tensor, dim)`` sizes in ``dynamic`` left free so that one
    graph serves them all; ``eager()`` where compiled loops cannot run, where one of those sizes
    is below 2 (a dynamic size cannot be 1, and a graph for it would be another compile), and
    after this loop's compile failed (``what`` names the loop, in the warning too)."""
    if not usable(what) or any(t.shape[d] < 2 for t, d in dynamic):
        return eager()
    for t, d in dynamic:
        torch._dynamo.mark_dynamic(t, d)
    try:
        with warnings.catch_warnings(), settings() if not _in_settings() else contextlib.nullcontext():
            # Compiling, torch calls its own deprecated torch.jit.script_method: nothing a user
            # can act on, printed wherever DeprecationWarnings show (under pytest, -W default).
            warnings.filterwarnings("ignore", message=_TORCH_OWN_DEPRECATION, category=DeprecationWarning)
            return _compile(fn)(*args)
    except Exception as e:  # the compiler's errors have no common type
        _failed.add(what)
        warn(f"torch.compile failed for {what} ({type(e).__name__}: "
             f"{str(e).splitlines()[0] if str(e) else ''}); its eager ops run instead", CompileWarning)
        return eager()

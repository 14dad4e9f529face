"""The queue's Lua, assembled two ways from the same files: one script per call (EVALSHA, any Redis) and
one function library (FUNCTION LOAD once, then FCALL; Redis 7 and later).

A script runs its whole chunk on every call, so Lua defines the library's ~150 functions anew each time
(about a third of a call's fixed cost, docs/development.md). A function library defines them once, when it
is loaded. Both forms start every call with ``begin_call`` (state.lua) and then run the call's own file.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import NamedTuple

LUA_DIR = Path(__file__).with_name("lua")
# the library every call starts with: state, then one file per policy seam, then the dispatch loop
LIBRARY = ("state", "rate_limits", "band_order", "fairness", "ordering", "gate", "placement", "dispatch")
SCRIPT_NAMES = (
    "enqueue", "register_replica", "deregister_replica", "report_signals", "complete", "cancel", "requeue",
    "renew", "expire", "snapshot",
)  # fmt: skip

_BEGIN = "local failed = begin_call({keys}, {argv})\nif failed then return failed end"
_REGISTER = "redis.register_function('{function}', function(keys, argv)\n{begin}\n{body}\nend)"


@cache
def _read(part: str) -> str:
    return (LUA_DIR / f"{part}.lua").read_text()


def _library() -> str:
    return "\n".join(_read(part) for part in LIBRARY)


def script_around(body: str) -> str:
    """Lua ``body`` as a script that runs after the library and ``begin_call``: KEYS and ARGV are taken
    first, before the library's locals of those names hide them."""
    prologue = "local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV"
    return "\n".join((prologue, _library(), _BEGIN.format(keys="EVAL_KEYS", argv="EVAL_ARGV"), body))


@cache
def script_source(name: str) -> str:
    """Call ``name`` (one of SCRIPT_NAMES) as a script."""
    return script_around(_read(name))


class FunctionLibrary(NamedTuple):
    """The queue's Lua as one function library: its name, its source, and the function of each call."""

    name: str
    source: str
    functions: dict[str, str]


@cache
def function_library() -> FunctionLibrary:
    """The function library. Its name carries a hash of the source, and each function's name the library's,
    so gateways of two releases (a rolling upgrade) each call their own code on one Redis."""
    # the hash covers everything the library holds but the names it derives: the files and the wrapping
    digest = hashlib.sha1("\n".join((_BEGIN, _REGISTER, _library(), *map(_read, SCRIPT_NAMES))).encode())
    library = f"fleetgate_{digest.hexdigest()[:12]}"
    functions = {name: f"{library}_{name}" for name in SCRIPT_NAMES}
    parts = [f"#!lua name={library}", _library()]
    for name in SCRIPT_NAMES:
        parts.append(_REGISTER.format(function=functions[name], begin=_BEGIN.format(keys="keys", argv="argv"),
                                      body=_read(name)))
    return FunctionLibrary(library, "\n".join(parts), functions)

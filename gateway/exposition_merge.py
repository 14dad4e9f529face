"""Merge Prometheus text expositions line by line, each source's samples given its own labels.

The fleet's ``/metrics`` merges every gateway's and replica's exposition (~100 kB with two vLLM replicas).
prometheus_client's parser takes about 25 ms of pure Python for that, and holds the GIL for all of it even
in a worker thread, so every scrape stalled the gateway's event loop. The merge needs no full parse: a
family's ``# HELP`` and ``# TYPE`` lines are kept once, in the order families first appear, and every sample
line gets the source's labels inserted after its name. prometheus_client writes a counter's or histogram's
``_created`` timestamps as gauge families of their own; they are dropped, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class _Family:
    __slots__ = ("help", "type", "samples")

    def __init__(self, help_line: str, type_: str) -> None:
        self.help, self.type, self.samples = help_line, type_, []


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _with_labels(line: str, labels: dict[str, str], injected: str) -> str | None:
    """``line`` with the source's ``labels`` (``injected``: them as text) first; a sample that has one of
    those labels itself takes the source's value (a duplicate label would make the exposition invalid)."""
    brace, space = line.find("{"), line.find(" ")
    if brace == -1 or (space != -1 and space < brace):  # no labels: name value
        return f"{line[:space]}{{{injected}}}{line[space:]}" if space != -1 else None
    end = line.rfind("}")
    own = line[brace + 1:end]
    if not any(f'{name}="' in own for name in labels):
        return f"{line[:brace]}{{{injected}{',' if own else ''}{line[brace + 1:]}"
    merged = {name: value for name, value in _LABEL.findall(own) if name not in labels}
    kept = ",".join(f'{name}="{value}"' for name, value in merged.items())  # values stay escaped
    return f"{line[:brace]}{{{injected}{',' if kept else ''}{kept}{line[end:]}"


def merge_expositions(entries: Iterable[tuple[dict[str, str], str]], skip: frozenset[str] = frozenset()) -> str:
    """One exposition of every ``(labels, text)`` source's families (``skip``: family names left out)."""
    families: dict[str, _Family] = {}
    for labels, text in entries:
        injected = ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items())
        current: _Family | None = None
        helps: dict[str, str] = {}
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("# HELP "):
                helps[line.split(" ", 3)[2]] = line
                continue
            if line.startswith("# TYPE "):
                _, _, name, type_ = (line.split(" ", 3) + [""])[:4]
                current = None
                if name in skip or (type_ == "gauge" and name.endswith("_created")):
                    continue
                family = families.setdefault(name, _Family(helps.get(name, ""), type_))
                current = family if family.type == type_ else None  # a clash of types: the first one's kept
                continue
            if line.startswith("#") or current is None:
                continue
            sample = _with_labels(line, labels, injected) if injected else line
            if sample is not None:
                current.samples.append(sample)
    out: list[str] = []
    for name, family in families.items():
        if family.help:
            out.append(family.help)
        out.append(f"# TYPE {name} {family.type}")
        out.extend(family.samples)
    return "\n".join(out) + "\n" if out else ""

"""Order inside a flow: first in, first out; a requeued ticket goes back to the head. Mirrored by
``fleet/lua/ordering.lua``.

Each length class has its own line, so a ticket that cannot be placed (its class's replicas are full)
holds back only later tickets of its class, never the flow's other classes: dispatch offers the head of
each class's line, earliest first. Positions come from one sequence the caller keeps: a ticket queued at
the tail takes the next number up, one put back at the head the next number down.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator


class Fifo:
    """The waiting tickets of one flow, in the order they run, one line per length class."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[tuple[int, str]]] = {}

    def add(self, ticket_id: str, length_class: str, position: int, at_head: bool = False) -> None:
        """Queue a ticket at the tail (or, requeued, at the head) of its class's line at ``position``."""
        line = self._lines.setdefault(length_class, deque())
        if at_head:
            line.appendleft((position, ticket_id))
        else:
            line.append((position, ticket_id))

    def remove(self, ticket_id: str, length_class: str) -> bool:
        """Take a ticket out; True when the flow has nothing waiting afterwards."""
        line = self._lines[length_class]
        line.remove(next(item for item in line if item[1] == ticket_id))
        if not line:
            del self._lines[length_class]
        return not self._lines

    def heads(self) -> list[str]:
        """The first ticket of each class's line, earliest first: the ones dispatch may take next."""
        return [ticket_id for _, ticket_id in sorted(line[0] for line in self._lines.values())]

    def __iter__(self) -> Iterator[str]:
        return iter([ticket_id for _, ticket_id in sorted(item for line in self._lines.values() for item in line)])

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

"""Order inside a flow: first in, first out; a requeued ticket goes back to the head. Mirrored by
``fleet/lua/ordering.lua``."""

from __future__ import annotations

from collections import deque


class Fifo:
    """The waiting tickets of one flow, in the order they run."""

    def __init__(self) -> None:
        self._ids: deque[str] = deque()

    def add(self, ticket_id: str, at_head: bool = False) -> None:
        """Queue a ticket at the tail (or, requeued, at the head)."""
        if at_head:
            self._ids.appendleft(ticket_id)
        else:
            self._ids.append(ticket_id)

    def remove(self, ticket_id: str) -> bool:
        """Take a ticket out; True when the flow has nothing waiting afterwards."""
        self._ids.remove(ticket_id)
        return not self._ids

    def head(self) -> str:
        """The ticket that runs next."""
        return self._ids[0]

    def __iter__(self):  # noqa: ANN204 - iterator of ticket ids
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

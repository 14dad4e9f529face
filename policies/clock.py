"""The queue's clock: the Redis server's wall clock, made safe to measure leases against.

Every lease, aging limit and rate-limit bucket is timed by one clock, read inside the scripts. A wall clock
can jump: a paused or migrated VM resumes with its clock stepped forward, NTP steps it either way. Forward
by more than a lease, every lease would lapse at the next call and every request in flight would be
dropped, although no gateway or replica died. So the queue's clock never runs backwards, and one step
between two calls counts at most ``max_step_ms``, half a lease. While anything lives, a gateway or replica
calls at least every third of a lease, so normal steps are never cut; a pause costs live leases at most
half their length, and the next renewals restore them. A holder that really died stops calling, and the
others' calls carry the clock past its lease as before. After a cut the clock runs behind the wall clock
by what was cut (``fleetgate status`` shows the wall clock).

Mirrored in fleet/lua/state.lua (``queue_time``), which gets ``max_step_ms`` in its config (fleet/queue.py).
"""

from __future__ import annotations


def queue_time(last_wall_ms: int | None, last_now_ms: int | None, wall_ms: int, max_step_ms: int) -> int:
    """The queue's time now, from the wall clock now and at the last call (None: the first call)."""
    if last_wall_ms is None or last_now_ms is None:
        return wall_ms
    return last_now_ms + min(max(wall_ms - last_wall_ms, 0), max_step_ms)


def max_step_ms(lease_ms: int) -> int:
    """The most one step between calls counts: half a lease, so a lease renewed every third of one survives
    a jump (it had at least two thirds left)."""
    return max(lease_ms // 2, 1)

"""The Redis-backed global queue: fleet-wide admission, ordering and placement in one atomic Lua step."""

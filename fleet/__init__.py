"""The fleet's shared state in Redis, used by gateways and replicas alike: key names, the global queue's Lua
scripts and typed client, capacity registration, rate limits and the metrics board."""

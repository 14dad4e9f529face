"""The Ray Serve gateway: OpenAI-compatible ingress, request life cycle, and (later) the global queue."""

"""vLLM replicas as Ray Serve deployments, their engine settings, and the tiny local model."""

"""Pure decision code (classification, fairness, ordering, placement, admission): no I/O, no Ray, no Redis."""

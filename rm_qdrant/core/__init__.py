"""Pure logic: no I/O, no clock, no Qdrant (merge, orders, planning, metrics, model facts)."""

"""Layer 6: the daemon lifecycle, the round driver, metrics and status."""

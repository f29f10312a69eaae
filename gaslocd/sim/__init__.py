"""Layer 5: N workers in one process over the in-memory transport, with a simulated clock."""

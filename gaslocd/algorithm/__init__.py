"""Layer 2: the GASLoC rule as pure functions on tensors (no I/O, no clock, no global RNG)."""

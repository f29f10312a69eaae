"""Layer 3: the model, token data, the inner loop and checkpoints (no networking)."""

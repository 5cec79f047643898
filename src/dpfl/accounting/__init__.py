"""Privacy accounting for federated learning: pure numerics, no torch."""

"""Simulation of federated training (torch): sampling, gradients, noise, loop."""

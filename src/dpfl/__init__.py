"""dpfl: differentially private federated learning with privacy amplification."""

__version__ = "0.1.0"

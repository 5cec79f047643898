"""dpfl's DP-FedAvg and DP-DSGD (random participation) as a Flower app."""

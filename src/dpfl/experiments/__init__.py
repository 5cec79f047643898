"""Experiments: configuration (YAML + validation), runner, resume, demo.

``load_config`` reads a run configuration; ``run`` trains it and writes
``runs/NAME/`` (config, metrics, ledger, checkpoints, figures); ``resume``
continues a stopped run; ``run_sweep`` runs a grid of overrides over several
seeds and writes a table (mean ± sd) and figures with seed bands. Importing
this package does not import torch: the runner imports it when a run starts.
"""

from dpfl.experiments.config import (
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    LossConfig,
    ModelConfig,
    PrivacyConfig,
    RunConfig,
    config_from_dict,
    load_config,
)
from dpfl.experiments.runner import RunResult, resume, run
from dpfl.experiments.sweep import SweepResult, run_sweep

__all__ = [
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "LossConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RunConfig",
    "RunResult",
    "SweepResult",
    "config_from_dict",
    "load_config",
    "resume",
    "run",
    "run_sweep",
]

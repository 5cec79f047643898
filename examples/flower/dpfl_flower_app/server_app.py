"""The ServerApp: dpfl's trainer (sampler, privatizer, ledger) drives the rounds."""

from __future__ import annotations

from dpfl.integrations.flower import server_app
from dpfl_flower_app.task import load_config

app = server_app(
    load_config,
    round_timeout=lambda context: float(context.run_config.get("round-timeout", 120)),
)

"""The ClientApp: dpfl client steps for the clients this SuperNode hosts.

The node resolves the same configuration as the server and refuses tasks
whose seed, data, model, algorithm or noise multiplier differ.
"""

from __future__ import annotations

from dpfl.integrations.flower import client_app
from dpfl_flower_app.task import load_config

app = client_app(load_config)

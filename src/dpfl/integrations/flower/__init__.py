"""dpfl in a Flower federation: the simulator's sampler, noise and ledger, deployed.

What was simulated is what is deployed. The ServerApp side drives the same
:class:`~dpfl.sim.loop.Trainer` that ``dpfl train`` drives, built by the same
builders from the same :class:`~dpfl.experiments.config.RunConfig`; the
ClientApp side runs the same :meth:`FederatedAlgorithm.client_step` with the
same per-client generators (:mod:`dpfl.sim.randomness`; with secure noise the
server sends each node the derived keys of its tasks' clients for the round,
never the run's key). A
Flower run therefore charges the ledger ``dpfl train`` charges, entry by
entry, and ends with its model up to float32 summation order.

Who runs what
-------------
Server (:class:`DpflStrategy`, in the ServerApp)
    per round: :meth:`Trainer.begin_round` (the budget guard, *before* anything
    is sent; then the server's sampler picks the cohort with the round's server
    generators), one train message per node hosting a task, the replies
    stacked in task order (:meth:`Messages.stack`), :meth:`Trainer.finish_round`
    (aggregation, dpfl's privatizer, the server update, the ledger charge);
    then the ledger and a checkpoint are written to the run folder.
Clients (:func:`client_app`, in each SuperNode's ClientApp)
    per task: the algorithm's ``client_step(weights, task,
    client_streams(seed, round, client))`` on a replica built from the run
    configuration the server sends: record-level per-sample clipping for
    DP-DSGD and PriFedSync, client-side noise for LOCKS and MS-PAFL and
    PriFedSync, the clipped local update for DP-FedAvg.
    A model or loss of the user's code (``model.factory``,
    ``loss.factory``) is imported by each ClientApp from its own
    environment, and its file must be the one the server recorded (the
    configuration carries its SHA-256): a node that cannot import it, or
    holds another version, refuses its tasks with a line naming the file.

Node and client mapping
-----------------------
Each SuperNode declares ``partition-id`` and ``num-partitions`` in its node
configuration (``flower-supernode --node-config "partition-id=0
num-partitions=3"``; the simulation engine sets them itself). Node ``j`` hosts
the dpfl clients ``k`` with ``k % num_partitions == j``. At start the
strategy sends every connected node a ``query`` message; each replies with its
two values, and the strategy waits until every partition has a node. A node
refuses a task for a client it does not host.

Faults
------
A round whose replies are incomplete (a node did not reply within
``round_timeout``, or replied with an error, or a partition has no live node)
is abandoned *before the server step* (:meth:`Trainer.abandon_round`): the
server releases nothing and the model is unchanged. It is charged nothing
when the server privatizes (central noise: the messages it received are not
releases) and its checked event, marked ``{"abandoned": true}``, when each
client message is itself a release (client-side noise: LOCKS, MS-PAFL,
PriFedSync), so a release is never left uncharged. The federation then goes
on with its next round.

Not supported: DP-DSGD with ``server: untrusted``. In the simulator its server
draws every message's noise at once (:class:`dpfl.sim.privatize.NoiseOnlyMessages`);
deployed, each client would draw its own noise and non-participants would send
noise only. That client step does not exist yet, so the strategy refuses the
configuration rather than run a deployment whose server holds the noise.

The package: :mod:`~dpfl.integrations.flower.server` (the strategy and the
ServerApp), :mod:`~dpfl.integrations.flower.client` (the ClientApp) and
:mod:`~dpfl.integrations.flower.wire` (what travels between them).
"""

try:
    import flwr.app  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without flwr only
    raise ImportError(
        "dpfl.integrations.flower needs Flower; install it with "
        "pip install 'dpfl[flower]'"
    ) from exc

from dpfl.integrations.flower.client import (
    client_app,
    client_step_message,
    partition_reply,
)
from dpfl.integrations.flower.server import (
    EXIT_SUPERLINK_LOST,
    DpflStrategy,
    build_trainer,
    server_app,
)
from dpfl.integrations.flower.wire import hosts

__all__ = [
    "EXIT_SUPERLINK_LOST",
    "DpflStrategy",
    "build_trainer",
    "client_app",
    "client_step_message",
    "hosts",
    "partition_reply",
    "server_app",
]

"""What a run checks before any work: its files, its sizes, its time per round.

:func:`dpfl.experiments.build.prepare` (what ``dpfl train`` and ``dpfl train
--check`` both run before a first round) calls these, in this order:

:func:`check_paths`
    The data's files must be regular files (or, for IDX and real data sets,
    folders): a FIFO, socket or device would block the read or never end.
:func:`check_data_size`
    For data generated from the configuration (``synthetic``,
    ``synthetic-images``), the records, features and the generator's working
    memory, computed from the configuration, against the memory available,
    *before* anything is generated; and an upper bound on the privacy units
    (records) the configuration can hold, so that a δ >= 1/n is refused
    before the data is built. Generated data may take at most
    :data:`DATA_SHARE` of the memory available.
:func:`check_model_size`
    The model's parameters, counted on PyTorch's ``meta`` device (no memory
    is taken), times what a round holds at once: a few copies of the model
    (weights, update, momentum, noise) and, for a cohort of clients trained
    together, two per client (their parameters and gradients, in chunks of
    ``max_clients``), in float32, against the memory available; and the
    secure noise a round draws at least (one model-sized vector), timed on
    this machine's sampler, against :data:`MAX_NOISE_SECONDS`.

The estimates are lower bounds of what a round needs (a round computes more
than this), so a refusal is never a false alarm of the estimate; each
refusal is one line naming the key, the size and the limit.
"""

from __future__ import annotations

import math
import os
import stat
import time
from typing import Any

from dpfl._validate import shown
from dpfl.experiments.config import ConfigError, RunConfig

__all__ = [
    "DATA_SHARE",
    "MAX_NOISE_SECONDS",
    "available_memory",
    "check_data_size",
    "check_model_size",
    "check_paths",
    "expected_cohort",
]

#: The longest one round's secure noise may take, by estimate (seconds): a
#: model whose noise alone would take longer is refused before the run (a
#: first round would not even end within a minute).
MAX_NOISE_SECONDS = 60.0

#: The share of the available memory generated data may take (the model,
#: its copies and the round's work need the rest).
DATA_SHARE = 0.5

#: Mean records per client of FedProx's unbalanced synthetic sizes,
#: ``int(LogNormal(4, 2)) + 50`` (e^(4 + 2²/2) + 50 ≈ 453).
_SYNTHETIC_MEAN_RECORDS = math.exp(4.0 + 2.0**2 / 2) + 50
#: Clients the synthetic generator draws models for at once.
_SYNTHETIC_CHUNK = 2048
_FLOAT = 4  # bytes of a float32
_INDEX = 8  # bytes of an int64 label or index

#: Data options that name files or folders (besides ``data.path``).
_PATH_OPTIONS = ("root", "test_path", "labels", "test_images", "test_labels")


def available_memory(device: str = "cpu") -> int:
    """Bytes of memory free for a run on ``device`` (``"cpu"`` or CUDA).

    On the CPU: the kernel's ``MemAvailable`` (what can be allocated without
    swapping), else the physical memory.
    """
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic systems
        return 1 << 62


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_paths(config: RunConfig) -> None:
    """Refuse data files that are not regular files or folders.

    Raises
    ------
    ConfigError
        Naming the key (``data.path``, ``data.options.test_path``, ...) whose
        path is a FIFO, socket or device: reading it could block forever.
    """
    data = config.data
    paths: dict[str, Any] = {"data.path": data.path}
    for key in _PATH_OPTIONS:
        value = data.options.get(key)
        if isinstance(value, str | os.PathLike):
            paths[f"data.options.{key}"] = value
    for key, value in paths.items():
        if value is None:
            continue
        try:
            mode = os.stat(value).st_mode
        except (OSError, ValueError):
            continue  # missing or unreadable: the loader names it
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ConfigError(
                f"{key} must be a regular file or a folder; got {shown(str(value))}, "
                "a FIFO, socket or device (reading it could block forever)"
            )


def _generated_size(config: RunConfig) -> tuple[int, int] | None:
    """(records, bytes) of generated data, from the configuration; None if read."""
    data = config.data
    name = data.name.lower().replace("_", "-")
    opts = data.options
    k = int(data.num_clients or 0)
    if name == "synthetic":
        per = data.records_per_client or opts.get("records_per_client")
        records = k * (int(per) if per is not None else _SYNTHETIC_MEAN_RECORDS)
        test = k * int(opts.get("test_records_per_client", 0))
        dim = int(opts.get("dim", 60))
        classes = int(opts.get("num_classes", 10))
        chunk = min(k, _SYNTHETIC_CHUNK) * (classes + 1) * (dim + 1) * _FLOAT
        size = (records + test) * (dim * _FLOAT + 2 * _INDEX) + chunk
        return int(records), int(size)
    if name == "synthetic-images":
        per = data.records_per_client or opts.get("records_per_client") or 0
        records = k * int(per)
        test = k * int(opts.get("test_records_per_client", 0))
        # pixels are built on demand: labels and indices are stored
        return records, (records + test) * 2 * _INDEX
    return None


def check_data_size(config: RunConfig) -> None:
    """Check what the configuration asks the data to hold, before building it.

    Raises
    ------
    ConfigError
        If generated data, or the clients' drawn test rows
        (``data.options.client_test_records``), would not fit in the memory
        available (naming the keys and the sizes), or δ >= 1/n for every data set
        the configuration can describe (n at most the records it holds)
        without ``privacy.allow_large_delta``.
    """
    data, priv = config.data, config.privacy
    generated = _generated_size(config)
    if generated is not None:
        records, size = generated
        free = available_memory()
        if size > DATA_SHARE * free:
            raise ConfigError(
                f"data.num_clients {data.num_clients} with these data.options "
                f"generate {records:.3g} records taking about {_gb(size)}; the data "
                f"may take at most {DATA_SHARE:.0%} of the {_gb(free)} available "
                "(the model and its training need the rest): use fewer clients, "
                "records or features"
            )
    tests = data.options.get("client_test_records")
    if tests is not None and data.num_clients:
        # each client's test rows are drawn (with replacement where a label
        # has fewer): clients x rows indices, however small the test set
        size = int(data.num_clients) * int(tests) * _INDEX
        free = available_memory()
        if size > DATA_SHARE * free:
            raise ConfigError(
                f"data.options.client_test_records {tests} for data.num_clients "
                f"{data.num_clients} draws {int(data.num_clients) * int(tests):.3g} "
                f"test rows taking about {_gb(size)}; the data may take at most "
                f"{DATA_SHARE:.0%} of the {_gb(free)} available: use fewer test "
                "records per client"
            )
    per = data.records_per_client or data.options.get("records_per_client")
    equal = data.partition == "equal-size" or generated is not None
    if per is None or not equal or not data.num_clients:
        return
    most = int(data.num_clients) * int(per)  # units are records or clients
    noisy = priv.noise_multiplier is None or priv.noise_multiplier > 0
    if noisy and priv.delta >= 1.0 / most and not priv.allow_large_delta:
        raise ConfigError(
            f"privacy.delta must be < 1/n for the n privacy units this run "
            f"protects; its data holds at most {most} records "
            f"(data.num_clients {data.num_clients} x {per}), so 1/n >= "
            f"{1.0 / most:.3g} (a delta that large allows releasing one unit's "
            f"data outright with probability delta); got {priv.delta!r}; set "
            "privacy.allow_large_delta: true to accept it"
        )


def expected_cohort(params: Any, num_clients: int) -> float:
    """The clients whose models or noise a round computes, in expectation.

    Read from the algorithm's parameters: a fixed ``cohort_size`` (a
    schedule's largest round), or a participation, check-in, first-stage or
    sync probability times the clients; every client where an untrusted
    server draws noise for all.
    """
    if getattr(params, "server", "trusted") != "trusted":
        return float(num_clients)
    if hasattr(params, "peak_cohort"):  # DP-FedAvg's per-round schedule
        return float(min(params.peak_cohort(), num_clients))
    cohort = getattr(params, "cohort_size", None)
    if cohort is not None:  # DSGD-RP's is optional (None: Poisson clients)
        return float(min(int(cohort), num_clients))
    for name in (
        "participation_probability",
        "checkin_probability",
        "first_stage_probability",
        "sync_probability",
    ):
        if hasattr(params, name):
            return float(getattr(params, name)) * num_clients
    return 1.0


def _seconds_per_normal() -> float:
    """Seconds per standard normal of the secure sampler, timed on this machine."""
    from dpfl.sim import secure_noise

    version = secure_noise.STREAM_VERSION  # the stream a new run draws
    n = 1 << 16
    secure_noise.secure_standard_normal(bytes(32), 0, 1024, version=version)
    start = time.perf_counter()
    secure_noise.secure_standard_normal(bytes(32), 1, n, version=version)
    return (time.perf_counter() - start) / n


def model_parameters(config: RunConfig, dataset: Any) -> int:
    """The model's parameter count, built on the ``meta`` device (no memory).

    A factory of the user's that cannot build on the ``meta`` device (one
    that loads weights, say) is built on the CPU instead, seeded as the run
    seeds it.
    """
    import torch

    from dpfl.experiments.model import build_model, make_model

    try:
        with torch.device("meta"):
            model = make_model(config, dataset)
    except Exception as exc:
        if "overflow" in str(exc).lower():
            # a layer's element count past what an index holds (2^63)
            raise ConfigError(
                f"{config.model.label} with these model.options is too large to "
                "exist (a layer's element count overflows 64 bits); use a "
                "smaller model"
            ) from None
        if config.model.factory is None:
            raise
        model = build_model(config, dataset)
    return int(sum(p.numel() for p in model.parameters()))


def check_model_size(config: RunConfig, dataset: Any, device: str = "cpu") -> int:
    """Check the model against memory and one round's secure noise against time.

    Returns
    -------
    int
        The model's parameter count.

    Raises
    ------
    ConfigError
        Naming ``model`` (and ``max_clients``), the estimate and the limit.
    """
    d = model_parameters(config, dataset)
    cohort = expected_cohort(config.algorithm.params, dataset.num_clients)
    held = min(cohort, config.max_clients) if config.max_clients else cohort
    need = d * _FLOAT * (4 + 2 * max(1.0, held))
    free = available_memory(device)
    if need > free:
        raise ConfigError(
            f"{config.model.label} with these model.options has {d:.3g} "
            f"parameters; a round holds about {_gb(need)} of them (the model, its "
            f"update and about {held:.3g} clients' parameters and gradients at "
            f"once) and {device} has {_gb(free)} available: use a smaller model "
            "or set max_clients"
        )
    if config.privacy.secure_noise and config.privacy.noise_multiplier != 0:
        seconds = d * _seconds_per_normal()
        if seconds > MAX_NOISE_SECONDS:
            raise ConfigError(
                f"{config.model.label} with these model.options has {d:.3g} "
                f"parameters: one round's secure noise alone would take about "
                f"{seconds:.0f} s on this machine (at least one model-sized "
                f"draw), more than {MAX_NOISE_SECONDS:g} s; use a smaller model"
            )
    return d

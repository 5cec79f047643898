"""Run configuration: one frozen dataclass tree, read from YAML, overridden by flags.

A run is described by a :class:`RunConfig` whose sections are
:class:`DataConfig`, :class:`ModelConfig`, :class:`AlgorithmConfig`,
:class:`PrivacyConfig` and :class:`RayConfig`. :func:`load_config` reads a
YAML file, applies ``--set key.sub=value`` overrides (values parsed as YAML,
so ``0.5`` is a float, ``null`` is ``None`` and ``[64, 32]`` a list) and
validates the result; :meth:`RunConfig.to_dict` gives back plain data for
writing the resolved configuration of a run.

Every error names the dotted key and the value found: an unknown key comes with
the closest known key (``difflib``), a wrong type with the expected type, an
out-of-range value with the allowed range. Errors are
:class:`ConfigError`, a :class:`~dpfl.errors.InvalidParameterError`, so the
command line prints them as one line and exits with status 2.

Examples
--------
>>> cfg = config_from_dict(
...     {"name": "demo", "rounds": 5, "privacy": {"epsilon": 4.0, "delta": 1e-5}},
...     overrides=["algorithm.params.learning_rate=0.5"],
... )
>>> cfg.algorithm.params.learning_rate, cfg.privacy.noise_multiplier is None
(0.5, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import re
import stat
import types
import typing
from collections import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dpfl._validate import (
    FLOAT_PATTERN,
    INT_PATTERN,
    MAX_EPSILON,
    MAX_ROUNDS,
    MAX_SEED,
    MIN_DELTA,
    NOISE_RANGE,
    parse_number,
    shown,
)
from dpfl.accounting.ledger import GUARDS as LEDGER_GUARDS
from dpfl.accounting.schemes import all_analyses
from dpfl.errors import InvalidParameterError
from dpfl.sim.executors import EXECUTION_NAMES

__all__ = [
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RayConfig",
    "RunConfig",
    "apply_overrides",
    "config_from_dict",
    "load_config",
    "load_yaml",
    "read_config_file",
]

GUARDS = tuple(LEDGER_GUARDS)
_DEVICES = ("cpu", "cuda", "auto")


class ConfigError(InvalidParameterError):
    """A configuration key is unknown, has the wrong type, or is out of range."""


# -- range checks (attached to fields as metadata) ------------------------------
def _positive(v: Any) -> str | None:
    return None if v is None or v > 0 else "must be > 0"


def _at_least(m: int) -> Any:
    def check(v: Any) -> str | None:
        return None if v is None or v >= m else f"must be >= {m}"

    return check


def _nonnegative(v: Any) -> str | None:
    return None if v is None or v >= 0 else "must be >= 0"


def _finite_positive(v: Any) -> str | None:
    return None if v is None or 0 < v < math.inf else "must be > 0 and finite"


def _finite_nonnegative(v: Any) -> str | None:
    return None if v is None or 0 <= v < math.inf else "must be >= 0 and finite"


def _address(v: Any) -> str | None:
    if v is None or v == "auto" or v.startswith("ray://"):
        return None
    host, sep, port = v.rpartition(":")
    if sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536:
        return None
    return "must be null (a local Ray instance), 'auto' or 'host:port'"


def _epsilon(v: Any) -> str | None:
    if 0 < v <= MAX_EPSILON or v == math.inf:
        return None
    return f"must be in (0, {MAX_EPSILON:g}] (e^epsilon must stay finite) or .inf"


def _noise(v: Any) -> str | None:
    if v is None or v == 0 or NOISE_RANGE[0] <= v <= NOISE_RANGE[1]:
        return None
    return (
        f"must be null (calibrate), 0 (no noise) or in [{NOISE_RANGE[0]:g}, "
        f"{NOISE_RANGE[1]:g}] (below, the privacy loss overflows; above, every "
        "epsilon is 0)"
    )


def _delta(v: Any) -> str | None:
    if MIN_DELTA <= v < 1:
        return None
    return (
        f"must be in [{MIN_DELTA:g}, 1) (below {MIN_DELTA:g} the accounting's "
        "double-precision rounding exceeds delta)"
    )


def _one_of(choices: Sequence[str | None]) -> Any:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {list(choices)}"

    return check


def _between(low: int, high: int, why: str = "") -> Any:
    def check(v: Any) -> str | None:
        return (
            None
            if v is None or low <= v <= high
            else f"must be in [{low}, {high}]{why}"
        )

    return check


#: The longest run name (a folder name; most file systems allow 255 bytes).
MAX_NAME_LENGTH = 200


def _name(v: Any) -> str | None:
    """A run name is one folder inside ``output_dir``: it cannot leave it."""
    if (
        not v
        or not v.strip()
        or any(c in v for c in "/\\:")
        or v in (".", "..")
        or not v.isprintable()
        or len(v) > MAX_NAME_LENGTH
    ):
        return (
            "must be one folder name inside output_dir: non-empty, printable, at "
            f"most {MAX_NAME_LENGTH} characters, without '/', '\\' or ':', and "
            "not '.' or '..'"
        )
    return None


def _directory(v: Any) -> str | None:
    if not v or not v.strip() or not v.isprintable():
        return "must be a non-empty, printable path"
    return None


def _field(default: Any = dataclasses.MISSING, check: Any = None, **kw: Any) -> Any:
    meta = {"check": check} if check is not None else {}
    if "default_factory" in kw:
        return dataclasses.field(default_factory=kw["default_factory"], metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# -- the tree -------------------------------------------------------------------
#: Data set names read from a user's file given by ``data.path``.
FILE_DATASETS = ("csv", "npz", "idx")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The federated data set.

    Attributes
    ----------
    name : str
        A name of :func:`dpfl.data.get_dataset` (``"digits"`` by default), or
        ``"csv"``, ``"npz"`` or ``"idx"`` for a file of one's own.
    path : str or None
        The file (or, for ``"idx"``, the directory of IDX files) of a
        ``csv``/``npz``/``idx`` data set; a relative path is taken from the
        working directory. Required for those names, refused for the others
        (the real data sets take ``options.root``).
    num_clients : int or None
        Number of clients; with ``partition: natural``, how many of the data's
        own clients to draw at random, or ``None`` for all of them.
    partition : str or None
        ``"equal-size"`` (d records each, the random-participation setting),
        ``"iid"``, ``"shards"``, ``"dirichlet"``, ``"natural"`` (the clients
        the data come with: a CSV client column, an npz client array,
        FEMNIST's writers), ...; ``None`` for data sets that are generated
        federated (``"synthetic"``).
    records_per_client : int or None
        d, for ``"equal-size"``.
    options : dict
        Further keyword arguments of :func:`~dpfl.data.get_dataset`
        (e.g. ``beta``, ``test_fraction``; for a CSV file ``label_column``,
        ``client_column``, ``feature_columns``, ``header``, ``delimiter``,
        ``test_path``, ``test_fraction``; for npz the array names
        ``features``, ``labels``, ``test_features``, ``test_labels``,
        ``clients``; for IDX ``labels``, ``test_images``, ``test_labels``).
    """

    name: str = "digits"
    path: str | None = None
    num_clients: int | None = _field(100, _at_least(1))
    partition: str | None = "equal-size"
    records_per_client: int | None = _field(None, _at_least(1))
    options: dict[str, Any] = _field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name in FILE_DATASETS and not self.path:
            raise ConfigError(
                f"data.path is required for data.name {shown(self.name)} (the file to "
                "read); got None"
            )
        if self.path is not None and self.name not in FILE_DATASETS:
            raise ConfigError(
                f"data.path is read only for data.name in {list(FILE_DATASETS)}; "
                f"got data.name {shown(self.name)} (a real data set's directory is "
                "data.options.root)"
            )
        if self.num_clients is None and self.partition != "natural":
            raise ConfigError(
                "data.num_clients may be null only with data.partition "
                f"'natural' (all of the data's own clients); got partition "
                f"{shown(self.partition)}"
            )
        from dpfl.data.registry import dataset_options

        schema = dataset_options(self.name)
        if schema is not None:  # an unknown name: get_dataset lists the names
            # what the runner passes itself (a section key left null passes
            # nothing, and its option is then the one value)
            given = {
                "num_clients": "data.num_clients",
                "seed": "seed (the run's seed seeds the data)",
                "partition": "data.partition",
                "records_per_client": "data.records_per_client",
                "path": "data.path",
            }
            given = {
                k: v
                for k, v in given.items()
                if k in ("num_clients", "seed") or getattr(self, k) is not None
            }
            checked = _check_options("data.options", self.options, schema, given)
            object.__setattr__(self, "options", checked)
            missing = [
                k
                for k, (_, required) in schema.items()
                if required and k not in checked and k not in given
            ]
            if missing:
                raise ConfigError(
                    f"data.options.{missing[0]} is required for data.name "
                    f"{shown(self.name)} (it takes {', '.join(sorted(schema))}); "
                    "got none"
                )


def _check_options(
    prefix: str,
    options: Mapping[str, Any],
    schema: Mapping[str, tuple[Any, bool]],
    given: Mapping[str, str],
) -> dict[str, Any]:
    """Check free-form ``options`` against the keywords of what receives them.

    Each option must be a keyword of the data loader or model (``schema``:
    name to type hint and whether it is required), of its type: a boolean is
    ``true`` or ``false`` (never a string such as ``"yes"``), a number follows
    the one rule of numbers; an option that a section key already sets
    (``given``: option to that key) is refused, as a key given twice.
    Numbers come back as the type their keyword takes.
    """
    out: dict[str, Any] = {}
    for key, value in options.items():
        dotted = f"{prefix}.{key}"
        if key in given:
            raise ConfigError(
                f"{dotted} is set by {given[key]}: a key given in two places is "
                f"refused; keep one; got {shown(value)}"
            )
        if key not in schema:
            raise _unknown(
                prefix + ".", key, sorted(k for k in schema if k not in given)
            )
        checked = _coerce(dotted, value, schema[key][0])
        plain = isinstance(checked, int | float) and not isinstance(checked, bool)
        out[key] = checked if plain else value
        if plain and isinstance(checked, float) and math.isnan(checked):
            raise ConfigError(f"{dotted} must not be NaN; got {shown(value)}")
    return out


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model: a name of :func:`dpfl.models.build_model` and its keywords."""

    name: str = "mlp"
    options: dict[str, Any] = _field(default_factory=dict)

    def __post_init__(self) -> None:
        from dpfl.models.registry import model_options

        schema = model_options(self.name)
        if schema is not None:  # an unknown name: build_model lists the names
            checked = _check_options("model.options", self.options, schema, {})
            object.__setattr__(self, "options", checked)


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """The federated algorithm and its parameters.

    ``params`` is the algorithm's own frozen parameters dataclass
    (:attr:`dpfl.sim.algorithms.base.FederatedAlgorithm.Params`): its fields,
    types, defaults and checks are the schema of this section. In YAML the
    parameters sit under ``params`` (or beside ``name``).

    Attributes
    ----------
    name : str
        A registered algorithm (:data:`dpfl.sim.algorithms.ALGORITHMS`).
    params : AlgorithmParams
        The algorithm's validated parameters.
    """

    name: str
    params: Any

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``{"name": ..., "params": {...}}``."""
        return {"name": self.name, "params": self.params.to_dict()}


def _build_algorithm_config(data: Mapping[str, Any], prefix: str) -> AlgorithmConfig:
    from dpfl.sim.algorithms import algorithm_class

    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.')} must be a mapping; got {shown(data)}")
    data = dict(data)
    name = data.pop("name", "dsgd-rp")
    try:
        cls = algorithm_class(name)
    except InvalidParameterError as exc:
        raise ConfigError(f"{prefix}name: {exc}") from None
    params = data.pop("params", None) or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{prefix}params must be a mapping; got {shown(params)}")
    twice = sorted(set(params) & set(data), key=str)
    if twice:
        key = twice[0]
        raise ConfigError(
            f"{prefix}{key} is given twice: beside name ({shown(data[key])}) and "
            f"under params ({shown(params[key])}); keep one"
        )
    params = {**params, **data}
    if "noise_multiplier" in params:
        raise ConfigError(
            f"{prefix}params.noise_multiplier is not an algorithm key: the noise "
            "multiplier lives in privacy.noise_multiplier (null: calibrate to the "
            f"budget; 0 with privacy.epsilon .inf: no noise); got "
            f"{shown(params['noise_multiplier'])}"
        )
    return AlgorithmConfig(
        name=cls.name, params=_build(cls.Params, params, prefix + "params.")
    )


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
    """The run's total privacy budget and how it is priced.

    Attributes
    ----------
    epsilon : float
        Total ε for the worst-off privacy unit over the whole run (``inf``:
        no guard and no calibration; then ``noise_multiplier`` must be
        given).
    delta : float
        Total δ in [1e-15, 1); must be below 1/n for n privacy units (records or
        clients) unless ``allow_large_delta``.
    analysis : str or None
        The analysis that prices each round; ``None`` (default): the
        algorithm's scheme default, its tightest proven analysis. An analysis
        that is not proven (``paper``, ``cs``, random participation's
        ``sound``) needs ``allow_unproven``.
    noise_multiplier : float or None
        σ: noise std over the clip (the algorithm's main noise; schemes with
        several noises scale the others with it). ``None``: calibrate σ so that
        ``rounds`` rounds fit the budget. ``0``: a non-private run (no noise,
        no guarantee; labelled non-private everywhere), declared with
        ``epsilon: .inf``: a finite budget with no noise is refused.
    guard : str
        The stop rule. ``"accountant"`` (default): the ledger refuses the
        round whose bound under ``analysis`` would pass the budget.
        ``"moments-accountant"``: DP-FedAvg's own rule (Geyer et al.,
        Algorithm 1): Abadi et al.'s moments accountant with the cohort read as
        Poisson, stopping when δ at ``epsilon`` would pass ``delta`` = Q;
        ``"rdp"``: the same with the improved RDP conversion. Both only for
        ``dp-fedavg`` with fixed cohorts and a given noise multiplier, and,
        since the Poisson reading is not valid for fixed cohorts, with
        ``allow_unproven``.
    allow_unproven : bool
        Run although the reported ε is not a proven bound (an unproven
        analysis or guard, or DP-FedAvg's median clipping, whose clip bound is
        released without noise); every ε shown is then labelled and the
        proven ε is shown beside it.
    allow_large_delta : bool
        Accept δ >= 1/n (n privacy units): such a δ allows releasing one
        unit's data outright with probability δ, so it is refused by default.
    secure_noise : bool
        ``True`` (default): participants and noise come from the run's secret
        key (the run folder's ``secret.key``; never share it), through a
        cryptographically secure, floating-point-safe sampler. ``False``:
        reproducible noise from ``seed``, which anyone with this config can
        regenerate and subtract; labelled so in the report, not for release.
    """

    epsilon: float = _field(4.0, _epsilon)
    delta: float = _field(1e-5, _delta)
    analysis: str | None = _field(None, _one_of((None, *all_analyses())))
    noise_multiplier: float | None = _field(None, _noise)
    guard: str = _field("accountant", _one_of(GUARDS))
    allow_unproven: bool = False
    allow_large_delta: bool = False
    secure_noise: bool = True


@dataclasses.dataclass(frozen=True)
class RayConfig:
    """Where and how wide ``execution: ray`` runs (other executions ignore it).

    The settings do not change the result: a run gives the same ledger and
    the same model (to float rounding) on any number of workers and nodes,
    so ``dpfl resume`` may continue a run with other settings.

    Attributes
    ----------
    address : str or None
        ``null`` (default): a private Ray instance on this machine, bound to
        127.0.0.1, started and stopped by the run. ``"auto"``: the cluster
        this machine joined with ``ray start``. ``"host:port"``: the cluster
        whose head node listens there (``ray start --head --port=...``).
    num_workers : int
        Ray actors; each runs one consecutive share of every round's cohort.
    num_cpus_per_worker : float
        CPUs each worker reserves (its torch uses as many threads, at least
        one); fractions share a CPU.
    num_gpus_per_worker : float
        GPUs each worker reserves; above 0 the workers compute on CUDA.
    """

    address: str | None = _field(None, _address)
    num_workers: int = _field(1, _at_least(1))
    num_cpus_per_worker: float = _field(1.0, _finite_positive)
    num_gpus_per_worker: float = _field(0.0, _finite_nonnegative)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; written resolved to ``runs/NAME/config.yaml``.

    Attributes
    ----------
    name : str
        Run name; the run writes to ``output_dir/name``.
    seed : int
        Seeds the partition, the model initialisation and every round.
    rounds : int
        Number of rounds T (the budget is for all T rounds).
    data, model, algorithm, privacy
        The sections.
    eval_every : int
        Evaluate (and compute ε spent) every this many rounds (and at the end).
    checkpoint_every : int
        Save a checkpoint and the ledger every this many rounds (and at the end).
    output_dir : str
        Parent folder of the run folder.
    device : str
        ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).
    execution : str
        How client steps run: ``"batched"`` (the cohort as one vectorised
        computation, default), ``"loop"`` (one client at a time, the
        reference) or ``"ray"`` (shares of the cohort on Ray actors, set up
        by the ``ray`` section; ``pip install 'dpfl[ray]'``); all give the
        same model to float rounding and the same ledger.
    ray : RayConfig
        Where ``execution: ray`` runs (ignored by the other executions).
    max_clients : int or None
        Clients per chunk of a batched computation (bounds memory).
    """

    name: str = _field("run", _name)
    seed: int = _field(0, _between(0, MAX_SEED))
    rounds: int = _field(
        100,
        _between(1, MAX_ROUNDS, " (the range the accounting answers in bounded time)"),
    )
    data: DataConfig = _field(default_factory=DataConfig)
    model: ModelConfig = _field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = _field(
        default_factory=lambda: _build_algorithm_config({}, "algorithm.")
    )
    privacy: PrivacyConfig = _field(default_factory=PrivacyConfig)
    eval_every: int = _field(10, _at_least(1))
    checkpoint_every: int = _field(50, _at_least(1))
    output_dir: str = _field("runs", _directory)
    device: str = _field("cpu", _one_of(_DEVICES))
    execution: str = _field("batched", _one_of(EXECUTION_NAMES))
    ray: RayConfig = _field(default_factory=RayConfig)
    max_clients: int | None = _field(None, _at_least(1))

    def __post_init__(self) -> None:
        priv = self.privacy
        if priv.noise_multiplier == 0 and not math.isinf(priv.epsilon):
            raise ConfigError(
                "privacy.noise_multiplier 0 adds no noise, so the run cannot keep "
                f"the budget privacy.epsilon {priv.epsilon:g}: declare a "
                "non-private run with privacy.epsilon: .inf and "
                "privacy.noise_multiplier: 0, or give a noise multiplier > 0 (or "
                "null, to calibrate); got noise_multiplier 0 with epsilon "
                f"{priv.epsilon:g}"
            )
        if math.isinf(priv.epsilon) and priv.noise_multiplier is None:
            raise ConfigError(
                "privacy.noise_multiplier must be given when privacy.epsilon is "
                "inf (there is no budget to calibrate to); got None"
            )
        if priv.guard != "accountant":
            params = self.algorithm.params
            needs = {
                "algorithm.name 'dp-fedavg'": self.algorithm.name == "dp-fedavg",
                "algorithm.params.sampling 'fixed'": getattr(
                    params, "sampling", "fixed"
                )
                == "fixed",
                "privacy.analysis null (the guard's own rule)": priv.analysis is None,
                "a noise multiplier (privacy.noise_multiplier)": bool(
                    priv.noise_multiplier
                ),
                "privacy.allow_unproven true (the rule reads the fixed cohort as "
                "Poisson sampling, which is not a valid bound for it)": (
                    priv.allow_unproven
                ),
            }
            missing = [k for k, ok in needs.items() if not ok]
            if missing:
                raise ConfigError(
                    f"privacy.guard {priv.guard!r} (DP-FedAvg's stop rule) "
                    f"needs {', '.join(missing)}"
                )

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration as plain data (YAML/JSON ready)."""
        out = dataclasses.asdict(self)
        out["algorithm"] = self.algorithm.to_dict()
        return out

    def replace(self, **changes: Any) -> RunConfig:
        """Return a copy with top-level fields replaced (validated again)."""
        return config_from_dict({**self.to_dict(), **_plain(changes)})

    @property
    def run_dir(self) -> Path:
        """``output_dir / name``."""
        return Path(self.output_dir) / self.name


def _plain(changes: Mapping[str, Any]) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        if isinstance(v, AlgorithmConfig):
            return v.to_dict()
        is_instance = dataclasses.is_dataclass(v) and not isinstance(v, type)
        return dataclasses.asdict(v) if is_instance else v

    return {k: plain(v) for k, v in changes.items()}


# -- building and validating -----------------------------------------------------
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Return ``value`` as type ``tp`` or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            with contextlib.suppress(ConfigError):
                return _coerce(key, value, a)
        raise ConfigError(
            f"{key} must be {_type_name(tp)}; got {shown(value)} "
            f"({type(value).__name__})"
        )
    if tp is Any:
        return value
    if origin in (list, tuple, abc.Sequence) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list; got {shown(value)}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return [_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(
                f"{key} must be one of {list(typing.get_args(tp))}; got {shown(value)}"
            )
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping; got {shown(value)}")
        return {str(k): v for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key} must be a mapping (a section); got {shown(value)}"
            )
        return _build(tp, value, key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false; got {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer; got {shown(value)}")
        if isinstance(value, str):
            value = _spelled(key, value, integer=True)
        if isinstance(value, int):
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise ConfigError(f"{key} must be a 64-bit integer; got {shown(value)}")
            return value
        if isinstance(value, float) and value.is_integer():
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise ConfigError(f"{key} must be a 64-bit integer; got {shown(value)}")
            return int(value)
        raise ConfigError(
            f"{key} must be an integer; got {shown(value)} ({type(value).__name__})"
        )
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number; got {shown(value)}")
        if isinstance(value, str):
            value = _spelled(key, value, integer=False)
        if not isinstance(value, int | float):
            raise ConfigError(
                f"{key} must be a number; got {shown(value)} ({type(value).__name__})"
            )
        if isinstance(value, int) and abs(value) > 1e300:  # float() would overflow
            raise ConfigError(f"{key} must be a number below 1e300; got {shown(value)}")
        if math.isnan(value):
            raise ConfigError(f"{key} must not be NaN; got {shown(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(
                f"{key} must be a string; got {shown(value)} ({type(value).__name__})"
            )
        return value
    return value  # pragma: no cover - every field type is handled above


def _spelled(key: str, text: str, *, integer: bool) -> int | float:
    """A number written as a string, read by the one rule of dpfl's numbers.

    (:func:`dpfl._validate.parse_number`: ASCII digits, sign, point and
    exponent; no ``_``, spaces or other scripts' digits.)
    """
    try:
        return parse_number(text, integer=integer)
    except ValueError:
        what = "an integer" if integer else "a number"
        raise ConfigError(
            f"{key} must be {what} written in ASCII digits (e.g. "
            f"{'100 or 1e3' if integer else '0.5 or 1e-5'}; no '_', spaces or "
            f"other digits); got {shown(text)} (str)"
        ) from None


def _unknown(prefix: str, key: str, known: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
    return ConfigError(
        f"unknown configuration key {shown(prefix + key)}{hint} "
        f"(known keys{' of ' + prefix.rstrip('.') if prefix else ''}: "
        f"{', '.join(known)})"
    )


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in fields:
            raise _unknown(prefix, str(key), list(fields))
        dotted = prefix + key
        if hints[key] is AlgorithmConfig:
            kwargs[key] = _build_algorithm_config(value or {}, dotted + ".")
            continue
        v = _coerce(dotted, value, hints[key])
        check = fields[key].metadata.get("check")
        if check is not None:
            problem = check(v)
            if problem:
                raise ConfigError(f"{dotted} {problem}; got {shown(value)}")
        kwargs[key] = v
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except InvalidParameterError as exc:
        # A section's own validation (e.g. an algorithm's Params): name the key.
        raise ConfigError(f"{prefix}{exc}") from None


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(
                f"cannot set {shown(dotted)}: {'.'.join(parts[: i + 1])} is "
                f"{shown(child)}, not a section"
            )
        node = child
    node[parts[-1]] = value


def apply_overrides(
    tree: Mapping[str, Any], overrides: Sequence[str]
) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a plain tree.

    Parameters
    ----------
    tree : mapping
        Configuration as plain data (not modified).
    overrides : sequence of str
        Items ``"dotted.key=value"``.

    Returns
    -------
    dict
        A deep copy of ``tree`` with the overrides applied.

    Raises
    ------
    ConfigError
        If an item has no ``=``, an empty key, or a value that is not YAML.
    """
    out = _deep_copy(tree)
    for item in overrides:
        _set_dotted(out, *parse_override(item))
    return out


#: The largest run configuration file read (presets are a few kilobytes).
MAX_CONFIG_BYTES = 1 << 20


class _RunConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing aliases and repeated keys; strict scalars.

    An alias (``*name``) lets a few hundred bytes stand for a structure of
    billions of nodes (the "billion laughs"), which any later walk or message
    would expand; a repeated key silently drops the first value.

    Scalars are read as YAML 1.2's core schema reads them, not 1.1's: a
    boolean is ``true`` or ``false`` only (``yes``, ``no``, ``on``, ``off``
    stay strings, which a boolean key refuses), and a number is spelled by
    the one rule of :func:`dpfl._validate.parse_number` (ASCII digits; ``1e-5``
    is a number, ``1_000``, ``0x10`` and ``1:30`` are strings, which a
    number key refuses).
    """

    def construct_yaml_int(self, node: Any) -> int:  # type: ignore[override]
        return int(self.construct_scalar(node))

    def construct_yaml_float(self, node: Any) -> float:  # type: ignore[override]
        text = str(self.construct_scalar(node))
        try:
            return float(parse_number(text))
        except ValueError:
            raise ConfigError(
                f"{shown(text)} (line {node.start_mark.line + 1}) is a number a "
                "double cannot hold (it overflows to infinity or underflows to "
                "0); write .inf for infinity"
            ) from None

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(
                f"YAML aliases are refused in a run configuration: write the "
                f"value out instead of *{shown(event.anchor, 40)} (line "
                f"{event.start_mark.line + 1})"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            with contextlib.suppress(TypeError):  # an unhashable key: refused later
                if key in seen:
                    raise ConfigError(
                        f"key {shown(key, 60)} appears twice in one mapping (line "
                        f"{key_node.start_mark.line + 1}); keep one"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


_YAML_BOOL, _YAML_INT, _YAML_FLOAT = (
    f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float")
)
_RunConfigLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx)
        for tag, rx in rules
        if tag not in (_YAML_BOOL, _YAML_INT, _YAML_FLOAT)
    ]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RunConfigLoader.add_implicit_resolver(
    _YAML_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_RunConfigLoader.add_implicit_resolver(
    _YAML_INT, re.compile(f"^{INT_PATTERN}$"), list("-+0123456789")
)
_RunConfigLoader.add_implicit_resolver(
    _YAML_FLOAT,
    # YAML's own spellings of infinity and NaN only: a bare ``inf`` stays a
    # string (a run may be named so), which a number key reads as infinity
    re.compile(rf"^(?:{FLOAT_PATTERN}|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)
_RunConfigLoader.add_constructor(_YAML_INT, _RunConfigLoader.construct_yaml_int)
_RunConfigLoader.add_constructor(_YAML_FLOAT, _RunConfigLoader.construct_yaml_float)


def load_yaml(
    text: str, where: str = "the configuration", kind: str = "valid YAML"
) -> Any:
    """Parse YAML as a run configuration: safely, without aliases or repeats.

    Parameters
    ----------
    text : str
        YAML text.
    where : str
        Names the text in error messages (a file, ``--set key``).
    kind : str
        What the text is not, when it does not parse (``"<where> is not
        <kind>: <why>"``).

    Returns
    -------
    Any
        The plain data (mappings, lists, scalars).

    Raises
    ------
    ConfigError
        On text that is not YAML, holds an alias or a repeated key, or nests
        too deeply; the message is one line.
    """
    try:
        return yaml.load(text, Loader=_RunConfigLoader)  # noqa: S506 (safe loader)
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        if len(problem) > 200:
            problem = problem[:200] + "..."
        raise ConfigError(f"{where} is not {kind}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{where} nests too deeply to be a configuration") from None
    except ConfigError:  # an alias or a repeated key
        raise
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise ConfigError(
            f"{where} holds a value YAML cannot read: {shown(str(exc), 120)}"
        ) from None


def parse_override(item: str) -> tuple[str, Any]:
    """Split one ``--set key.sub=value`` item into its key and YAML value.

    Parameters
    ----------
    item : str
        ``key.sub=value``; an empty value is ``None``.

    Returns
    -------
    tuple of (str, Any)
        The dotted key and the parsed value.

    Raises
    ------
    ConfigError
        If the item has no ``=``, an empty key or key part, or a value that
        is not YAML.
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise ConfigError(f"--set expects key.sub=value; got {shown(item)}")
    where = f"--set {key}: value {shown(raw)}"
    value = load_yaml(raw, where, "YAML") if raw.strip() else None
    return key, value


def _deep_copy(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def config_from_dict(
    data: Mapping[str, Any] | None, overrides: Sequence[str] = ()
) -> RunConfig:
    """Validate plain data (plus overrides) into a :class:`RunConfig`.

    Parameters
    ----------
    data : mapping or None
        The configuration tree; missing keys take their defaults.
    overrides : sequence of str
        ``"key.sub=value"`` items applied first.

    Returns
    -------
    RunConfig
        The validated configuration.

    Raises
    ------
    ConfigError
        On an unknown key (with the closest known one), a wrong type or an
        out-of-range value; the message names the dotted key and the value.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"a configuration must be a mapping; got {shown(data)}")
    tree = apply_overrides(data, overrides)
    _check_numbers(tree, "")
    return _build(RunConfig, tree)


#: The integers a configuration may hold anywhere (free-form ``options``
#: included): 64-bit, what numpy and torch take. NaN is refused anywhere too.
INT_RANGE = (-(2**63), 2**63 - 1)


def _check_numbers(node: Any, key: str) -> None:
    """Refuse NaN or an integer outside 64 bits anywhere, naming the key."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            _check_numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            _check_numbers(v, f"{key}[{i}]")
    elif isinstance(node, int) and not INT_RANGE[0] <= node <= INT_RANGE[1]:
        raise ConfigError(
            f"{key[:60]} must be a 64-bit integer (at most {INT_RANGE[1]} in size); "
            f"got {shown(node)}"
        )
    elif isinstance(node, float) and math.isnan(node):
        raise ConfigError(f"{key[:60]} must not be NaN; got nan")


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run configuration and apply ``--set`` overrides.

    Parameters
    ----------
    path : str or Path
        The YAML file.
    overrides : sequence of str
        ``"key.sub=value"`` items; values are parsed as YAML.

    Returns
    -------
    RunConfig
        The validated configuration.

    Raises
    ------
    ConfigError
        If the file is missing or not YAML, or on an invalid key or value.
    """
    return config_from_dict(read_config_file(path), overrides)


def read_config_file(path: str | Path) -> Any:
    """Read a YAML run configuration file as plain data (not yet validated).

    The file is read safely (:func:`load_yaml`: no aliases, no repeated
    keys), must be UTF-8 and at most :data:`MAX_CONFIG_BYTES` long.

    Parameters
    ----------
    path : str or Path
        The YAML file.

    Returns
    -------
    Any
        The parsed data (a mapping for a configuration).

    Raises
    ------
    ConfigError
        If the file is missing, unreadable, too large, not UTF-8 or not YAML.
    """
    p = Path(path)
    where = shown(str(p))
    try:
        # non-blocking: opening a FIFO must not wait for a writer
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {where}") from None
    except (OSError, ValueError) as exc:  # no permission, a NUL in the name
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ConfigError(f"cannot read configuration file {where}: {reason}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(
            f"configuration file {where} is not a regular file (a folder, FIFO, "
            "socket or device); give the YAML file itself"
        )
    with os.fdopen(fd, "rb") as fh:
        try:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(
                f"cannot read configuration file {where}: {exc.strerror}"
            ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"configuration file {where} is larger than {MAX_CONFIG_BYTES} bytes; "
            "a run configuration is a few kilobytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"configuration file {where} is not UTF-8 text (byte {exc.start})"
        ) from None
    return load_yaml(text, where)

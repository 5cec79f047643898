"""Property-based fuzzing of run configurations (hypothesis).

Each example is a run configuration: a preset (or a tiny digits run) with
keys replaced by drawn values (wrong types, out of range, NaN and
infinities, huge integers, long strings, lists and mappings), deleted or
added, or a file that is not a configuration at all (empty, binary, not
UTF-8, not a mapping, YAML aliases and alias bombs, repeated keys, deep
nesting, Python tags). ``dpfl train FILE --check`` validates it without
running; it must exit 0 (a valid configuration) or 2 with one short line
naming the key, within a time bound: no traceback, no hang. Values known
to be invalid (a huge integer, NaN, a run name that leaves the output
folder, no noise under a finite budget) must be refused: no silent
acceptance. A few tiny digits runs train for one round to check that what
``--check`` accepts also runs (slow profile: a run takes seconds).
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_cli import _inside, check_outcome, run_cli

from dpfl._validate import MAX_ROUNDS, parse_number
from dpfl.experiments.presets import PRESET_DIR

PRESETS = sorted(PRESET_DIR.glob("*.yaml"))

#: A run small enough to train one round in about a second.
TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 0,
    "rounds": 1,
    "data": {
        "name": "digits",
        "num_clients": 20,
        "partition": "equal-size",
        "records_per_client": 5,
    },
    "model": {"name": "mlp", "options": {"hidden": [8]}},
    "algorithm": {
        "name": "dsgd-rp",
        "params": {
            "participation_probability": 0.5,
            "record_probability": 0.5,
            "clip": 1.0,
            "learning_rate": 0.5,
        },
    },
    "privacy": {"epsilon": 4.0, "delta": 1e-5, "analysis": "ols"},
    "eval_every": 1,
    "checkpoint_every": 1,
}

#: Numbers spelled in other scripts or with separators, and booleans spelled
#: as words: refused wherever a number or a boolean is due (one spelling).
SPELLINGS = [
    "\uff11\uff12",  # full-width 12
    "\u0661\u0662",  # Arabic-Indic 12
    "1\u00a0",  # a no-break space after 1
    "\u00a00.5",
    "1_000",
    "1e-6_0",
    "0x10",
    " 3",
    "yes", "no", "on", "off", "true", "false", "True", "1", "0",
]  # fmt: skip

VALUES = st.one_of(
    st.sampled_from(
        [
            0, -1, 1, 2, 10**12, 2**63, 10**400, 0.5, 1e-300, 1e300, 1e308,
            5e-324, math.nan, math.inf, -math.inf, -0.0, "", "abc", "\x00\xff",
            "x" * 5000, None, True, False, [], [1, 2], {}, {"a": 1}, "1e-5",
            "../../escape", "/abs/path", "..", ".", "a/b", "a\\b", *SPELLINGS,
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
)  # fmt: skip

#: Files that are not run configurations.
RAW: dict[str, bytes] = {
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "latin1": "name: caf\xe9\n".encode("latin1"),
    "list": b"- 1\n- 2\n",
    "scalar": b"42\n",
    "alias": b"x: &r 3\nrounds: *r\n",
    "alias bomb": b"a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + b"".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n".encode()
        for p, n in zip("abcdefgh", "bcdefghi")
    )
    + b"data: {options: {x: *i}}\n",
    "merge": b"base: &b {rounds: 1}\n<<: *b\n",
    "repeated key": b"rounds: 1\nrounds: 2\n",
    "repeated nested key": b"privacy:\n  epsilon: 1\n  epsilon: 2\n",
    "deep list": b"[" * 5000 + b"]" * 5000,
    "deep mapping": b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000,
    "python tag": b"rounds: !!python/object/apply:os.system ['echo hi']\n",
    "not yaml": b"a: [1\n",
    "huge integer": b"rounds: " + b"9" * 5000 + b"\n",
    "nan": b"privacy: {epsilon: .nan}\n",
    "no noise, finite budget": b"privacy: {epsilon: 4, noise_multiplier: 0}\n",
    "escaping name": b"name: ../../outside\n",
    "absolute name": b"name: /tmp/outside\n",
    "empty name": b"name: ''\n",
    "too large": b"# " + b"x" * (1 << 20) + b"\n",
}

#: Of RAW, the files ``--check`` must refuse: all of them. (An empty file
#: gives every key its default, a valid configuration, but not a run: the
#: default equal-size partition needs data.records_per_client, and --check
#: refuses what train would.)
REFUSED = set(RAW)


def _leaves(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(tree, dict) and tree:
        return [p for k, v in tree.items() for p in _leaves(v, (*prefix, k))]
    return [prefix] if prefix else []


#: A parameter of each algorithm (and a valid value of it for its own).
FOREIGN = {
    "cohort_size": 4,
    "participation_probability": 0.5,
    "second_stage_size": 3,
    "checkin_probability": 0.5,
    "sync_probability": 0.5,
    "local_learning_rate": 0.1,
}


def _own_params(name: Any) -> set[str]:
    import dataclasses

    from dpfl.sim.algorithms import algorithm_class

    try:
        return {f.name for f in dataclasses.fields(algorithm_class(str(name)).Params)}
    except Exception:  # an unknown (mutated) name: refused anyway
        return set()


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _known_invalid(path: tuple[str, ...], value: Any, was: Any = None) -> bool:
    """Values no configuration key accepts (``was``: the key's valid value)."""
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return True
    if isinstance(was, bool) and not isinstance(value, bool):
        return True  # a boolean key: true or false, never "yes" or 1
    if isinstance(was, int | float) and not isinstance(was, bool):
        if isinstance(value, bool):
            return True
        if isinstance(value, str):  # a number key reads one spelling
            try:
                parse_number(value, integer=isinstance(was, int))
            except ValueError:
                return True
    if path == ("privacy", "delta") and isinstance(value, int | float):
        return not 1e-15 <= value < 1  # below 1e-15: refused (double precision)
    if path == ("name",):
        return (
            not isinstance(value, str)
            or value in ("", ".", "..")
            or any(c in value for c in "/\\:")
        )
    if path == ("rounds",):
        # an integer key takes any spelling of a whole number (90, 90.0, "1e3")
        number = value
        if isinstance(value, str):
            try:
                number = parse_number(value, integer=True)
            except ValueError:
                return True
        if isinstance(number, bool) or not isinstance(number, int | float):
            return True
        if isinstance(number, float) and not number.is_integer():
            return True
        return not 1 <= number <= MAX_ROUNDS
    return False


def _write(tmp: Path, text: bytes, name: str = "run.yaml") -> Path:
    path = tmp / name
    path.write_bytes(text)
    return path


def _dump(tree: Any) -> bytes:
    return yaml.safe_dump(tree, allow_unicode=True).encode("utf-8")


def check_config(
    tmp: Path, text: bytes, invalid: list[str], named: bool = False
) -> int:
    """``dpfl train FILE --check``: 0, or 2 naming one of ``invalid``.

    With several mutations the first problem found is named, which may be
    another mutated key; the line is then only checked to be one line (the
    single-change tests check the naming).
    """
    path = _write(tmp, text)
    argv = ["train", str(path), "--check"]
    with _inside(tmp):
        status, out, err = run_cli(argv)
    check_outcome(argv, status, out, err, invalid=invalid, named=named)
    return status


SETTINGS = settings(
    max_examples=80,
    derandomize=True,
    deadline=None,  # bounded by the alarm of run_cli
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def mutated(draw: Any, presets: bool = True) -> tuple[bytes, list[str]]:
    """A mutated configuration and the keys given values known to be invalid."""
    source = draw(st.sampled_from(PRESETS)) if presets else None
    tree = yaml.safe_load(source.read_text()) if source else copy.deepcopy(TINY)
    bad: dict[tuple[str, ...], bool] = {}  # the keys set, and if invalid
    foreign: set[str] = set()  # parameters of other algorithms added
    twice: set[str] = set()  # parameters also given beside the name
    leaves = _leaves(tree)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(["set", "set", "set", "delete", "add", "foreign", "twice"])
        )
        path = draw(st.sampled_from(leaves))
        if how == "delete":
            parent = tree
            for key in path[:-1]:
                parent = parent.get(key, {}) if isinstance(parent, dict) else {}
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            bad = {p: b for p, b in bad.items() if p[: len(path)] != path}
        elif how == "add":
            key = draw(st.sampled_from(["unknown_key", "rounds ", "Seed"]))
            tree[key] = 1
            bad[(key,)] = True  # an unknown key is refused
        elif how == "foreign" and isinstance(tree.get("algorithm"), dict):
            # a parameter of another algorithm: not this one's, refused
            name = tree["algorithm"].get("name", "dsgd-rp")
            key, value = draw(st.sampled_from(sorted(FOREIGN.items())))
            if key in _own_params(name):
                continue
            params = tree["algorithm"].setdefault("params", {})
            if isinstance(params, dict):
                params[key] = value
                foreign.add(key)
        elif how == "twice" and isinstance(tree.get("algorithm"), dict):
            # a parameter beside name and under params: refused as given twice
            params = tree["algorithm"].get("params")
            if isinstance(params, dict) and params:
                key = draw(st.sampled_from(sorted(params)))
                tree["algorithm"][key] = params[key]
                twice.add(key)
        else:
            value = draw(VALUES)
            was = _get(tree, path)
            try:
                _set(tree, path, value)
            except (TypeError, KeyError):
                continue
            bad = {p: b for p, b in bad.items() if p[: len(path)] != path}
            bad[path] = _known_invalid(path, value, was)
    # what the later mutations left of the foreign and repeated keys
    algorithm = tree.get("algorithm")
    params = algorithm.get("params") if isinstance(algorithm, dict) else None
    if isinstance(params, dict):
        own = _own_params(algorithm.get("name", "dsgd-rp"))
        bad.update({("p", k): True for k in foreign if k in params and k not in own})
        bad.update({("a", k): True for k in twice if k in params and k in algorithm})
    invalid = [p[-1] for p, b in bad.items() if b]
    try:
        return _dump(tree), invalid
    except yaml.YAMLError:
        return b"rounds: 1\n", []


#: What the line refusing each file names.
NAMED = {
    "no noise, finite budget": "noise_multiplier",
    "escaping name": "name",
    "absolute name": "name",
    "empty name": "name",
    "nan": "epsilon",
    "alias": "alias",
    "alias bomb": "alias",
    "merge": "alias",
    "repeated key": "twice",
    "repeated nested key": "twice",
    "huge integer": "integer",
    "too large": "larger than",
    "binary": "UTF-8",
    "latin1": "UTF-8",
    "deep list": "deeply",
    "deep mapping": "deeply",
    "empty": "records_per_client",
}


@pytest.mark.parametrize("kind", sorted(RAW))
def test_files_that_are_not_configurations(tmp_path: Path, kind: str) -> None:
    invalid = [NAMED.get(kind, "")] if kind in REFUSED else []
    status = check_config(tmp_path, RAW[kind], invalid, named=True)
    assert status == (2 if kind in REFUSED else 0)


def test_an_alias_bomb_gives_a_short_error(tmp_path: Path) -> None:
    """379 bytes of YAML once expanded into a 351 MB message; now one line."""
    path = _write(tmp_path, RAW["alias bomb"])
    status, _, err = run_cli(["train", str(path), "--check"])
    assert status == 2 and len(err) < 400 and "alias" in err


@SETTINGS
@given(mutated(presets=True))
def test_mutated_presets_validate_or_refuse(
    tmp_path_factory: Any, case: tuple[bytes, bool]
) -> None:
    text, invalid = case
    check_config(tmp_path_factory.mktemp("cfg"), text, invalid)


@SETTINGS
@given(
    st.sampled_from(_leaves(TINY)),
    VALUES,
)
def test_set_overrides_validate_or_refuse(
    tmp_path_factory: Any, path: tuple[str, ...], value: Any
) -> None:
    tmp = tmp_path_factory.mktemp("set")
    config = _write(tmp, _dump(TINY))
    try:
        text = yaml.safe_dump(value, default_flow_style=True).strip()
    except yaml.YAMLError:
        return
    if text.endswith("\n...") or text.endswith("..."):
        text = text.rsplit("...", 1)[0].strip()
    argv = ["train", str(config), "--check", "--set", f"{'.'.join(path)}={text}"]
    with _inside(tmp):
        status, out, err = run_cli(argv)
    invalid = [path[-1]] if _known_invalid(path, value, _get(TINY, path)) else []
    check_outcome(argv, status, out, err, invalid=invalid)


def _train_one_round(tmp: Path, text: bytes) -> None:
    path = _write(tmp, text)
    argv = ["train", str(path), "--out", str(tmp / "runs"), "--no-progress"]
    with _inside(tmp):
        status, out, err = run_cli(argv)
    check_outcome(argv, status, out, err, invalid=[])


@SETTINGS
@given(mutated(presets=False))
def test_mutated_tiny_runs_validate_or_refuse(tmp_path_factory: Any, case: Any) -> None:
    text, invalid = case
    check_config(tmp_path_factory.mktemp("tiny"), text, invalid)


@pytest.mark.slow
@settings(SETTINGS, max_examples=1500)
@given(mutated(presets=True))
def test_mutated_presets_many(tmp_path_factory: Any, case: Any) -> None:
    text, invalid = case
    check_config(tmp_path_factory.mktemp("cfg"), text, invalid)


@pytest.mark.slow
@settings(SETTINGS, max_examples=10)
@given(mutated(presets=False))
def test_what_check_accepts_trains(tmp_path_factory: Any, case: Any) -> None:
    text, invalid = case
    tmp = tmp_path_factory.mktemp("train")
    status = check_config(tmp, text, invalid)
    if status == 0:
        tree = yaml.safe_load(text) or {}
        if isinstance(tree, dict) and tree.get("rounds", 1) in (1, 2):
            _train_one_round(tmp, text)


def test_the_oracle_reads_rounds_as_the_configuration_does() -> None:
    # benchmarks/fuzz.py (--seed 2) counted rounds: 90.0 as a silent accept:
    # the oracle, not dpfl, was wrong (an integer key takes a whole number in
    # any spelling). Each case: what the oracle says, what the config does.
    from dpfl.experiments.config import ConfigError, config_from_dict

    for value in (90, 90.0, "1e3", "90", 1e5, 0, 2.5, 1e6, "abc", True, None, "9_0"):
        invalid = _known_invalid(("rounds",), value, 1)
        try:
            config_from_dict({"rounds": value})
            accepted = True
        except ConfigError:
            accepted = False
        assert invalid != accepted, value


# -- run names, the demo's folder -----------------------------------------------
@pytest.mark.parametrize(
    "name", ["", " ", ".", "..", "../x", "/tmp/x", "a/b", "a\\b", "C:x", "a\nb"]
)
def test_run_names_cannot_leave_the_output_folder(name: str) -> None:
    from dpfl.experiments.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="^name must be one folder name"):
        config_from_dict({"name": name})


def test_no_noise_under_a_finite_budget_is_refused() -> None:
    from dpfl.experiments.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=r"epsilon: \.inf"):
        config_from_dict({"privacy": {"epsilon": 4, "noise_multiplier": 0}})
    cfg = config_from_dict({"privacy": {"epsilon": math.inf, "noise_multiplier": 0}})
    assert cfg.privacy.noise_multiplier == 0


def test_demo_never_deletes_a_users_run(tmp_path: Path) -> None:
    from dpfl.errors import InvalidParameterError
    from dpfl.experiments.demo import MARKER, _claim

    mine = tmp_path / "runs" / "sound"
    mine.mkdir(parents=True)
    (mine / "config.yaml").write_text("name: sound\n")
    with pytest.raises(InvalidParameterError, match="not empty"):
        _claim(tmp_path)
    assert (mine / "config.yaml").exists()
    # a folder an earlier demo made is the demo's own
    ours = tmp_path / "demo"
    _claim(ours)
    assert (ours / MARKER).exists()
    (ours / "runs" / "wcs").mkdir(parents=True)
    _claim(ours)
    (ours / "runs" / "mine").mkdir()
    with pytest.raises(InvalidParameterError, match="runs/mine"):
        _claim(ours)
    assert os.path.isdir(ours / "runs" / "mine")

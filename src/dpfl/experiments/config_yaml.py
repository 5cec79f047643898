"""Reading run configurations: YAML safely, ``--set`` overrides, files.

:func:`load_yaml` parses YAML as a run configuration (YAML 1.2's core
scalars, no aliases, no repeated keys); :func:`parse_override` and
:func:`apply_overrides` apply ``--set key.sub=value`` items to a plain tree;
:func:`read_config_file` reads a configuration file (a regular UTF-8 file of
at most :data:`MAX_CONFIG_BYTES`). Errors are
:class:`~dpfl.experiments.config_schema.ConfigError`, one line each.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dpfl._validate import FLOAT_PATTERN, INT_PATTERN, parse_number, shown
from dpfl.experiments.config_schema import ConfigError

__all__ = [
    "MAX_CONFIG_BYTES",
    "apply_overrides",
    "load_yaml",
    "parse_override",
    "read_config_file",
    "set_dotted",
]


#: Keys that name a model or loss anew: setting one drops its section's
#: recorded ``factory_sha256`` (the hash of the factory named before), so the
#: file of the one named now is taken as it is.
_NAMING_KEYS = ("model.name", "model.factory", "loss.factory")


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``tree[a][b]...`` for ``dotted`` = ``"a.b..."``, making sections.

    Setting ``model.name``, ``model.factory`` or ``loss.factory`` drops the
    section's ``factory_sha256``: a recorded hash belongs to the factory
    named when it was recorded (a sweep over ``model.factory``, or a run's
    ``config.yaml`` reused with another factory, takes the new one's file as
    it is).
    """
    parts = dotted.split(".")
    if dotted in _NAMING_KEYS and isinstance(tree.get(parts[0]), dict):
        tree[parts[0]].pop("factory_sha256", None)
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
        set_dotted(out, *parse_override(item))
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

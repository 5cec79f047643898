"""Models and losses of one's own, named in a configuration.

A configuration names a callable of the user's code as ``"package.module:name"``
(``model.factory``, ``loss.factory``): :func:`load_factory` imports
``package.module`` from the running Python's ``sys.path`` as it is (an
installed package, a folder on ``PYTHONPATH``; nothing is added to it: not
the working directory, which the ``dpfl`` command does not search, nor the
configuration file's folder), reads the attribute ``name`` (a dotted path
such as ``Net.build`` is followed), and hashes the file that defines it
(SHA-256 of its bytes): the hash a run records, so that a run is resumed, and
a Flower node or a Ray worker computes, only with the code it started with.

:func:`factory_options` reads what the callable takes from its signature, so
that ``options`` are checked as the built-in models' are (a keyword it does
not take is refused with the closest one it takes, a required one must be
given); :func:`call_factory` calls it with the options and the keywords dpfl
passes itself (a model factory's ``input_shape`` and ``num_classes``, when
its signature takes them).

Every error is a :class:`~dpfl.experiments.config_schema.ConfigError` (or,
once the callable runs, an :class:`~dpfl.errors.InvalidParameterError`) naming
the key and the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dpfl._validate import shown
from dpfl.errors import InvalidParameterError
from dpfl.experiments.config_schema import ConfigError

__all__ = [
    "Factory",
    "call_factory",
    "factory_options",
    "file_sha256",
    "load_factory",
]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``package.module:name`` (the name may be dotted: ``module:Class.method``).
SPEC = re.compile(rf"^{_NAME}(\.{_NAME})*:{_NAME}(\.{_NAME})*$")

_WHERE = (
    "a factory is imported from this Python's sys.path: an installed package "
    "or a folder on PYTHONPATH (the `dpfl` command does not search the working "
    "directory, nor the configuration file's folder)"
)


@dataclasses.dataclass(frozen=True)
class Factory:
    """A callable named by a configuration, and the file it comes from.

    Attributes
    ----------
    spec : str
        ``"package.module:name"`` as configured.
    obj : callable
        What it names.
    path : Path
        The file that defines it (of the class, for a class; of the module,
        for an object without a source of its own).
    sha256 : str
        SHA-256 of that file's bytes (64 hex digits).
    """

    spec: str
    obj: Callable[..., Any]
    path: Path
    sha256: str


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (
        f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    )


def _source_file(obj: Any, module: Any) -> Path | None:
    try:
        found = inspect.getsourcefile(inspect.unwrap(obj))
    except TypeError:  # a partial, an instance, a builtin: its module's file
        found = None
    if found is None:
        found = getattr(module, "__file__", None)
    return None if found is None else Path(found).resolve()


def load_factory(spec: Any, key: str, recorded: str | None = None) -> Factory:
    """Import the callable ``spec`` names and hash the file that defines it.

    Parameters
    ----------
    spec : str
        ``"package.module:name"``.
    key : str
        The configuration key (``"model.factory"``), named in errors.
    recorded : str or None
        The SHA-256 the file must have (a started run's, a Flower server's);
        ``None``: the file as it is.

    Returns
    -------
    Factory

    Raises
    ------
    ConfigError
        If ``spec`` is not of that form, the module cannot be imported (the
        message says where factories are imported from), it has no such
        attribute (with the closest one), the attribute is not callable or
        has no source file, or the file's hash is not ``recorded`` (naming
        the file).
    """
    if not isinstance(spec, str) or not SPEC.match(spec):
        raise ConfigError(
            f"{key} must be 'package.module:name' (a callable of an importable "
            f"module, e.g. 'mymodels:make_model'); got {shown(spec)}"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                f"{key}: no module named {missing!r} can be imported ({_WHERE}); "
                f"got {shown(spec)}"
            ) from None
        raise ConfigError(
            f"{key}: importing module {module_name!r} failed: {_first_line(exc)} "
            f"(a module it imports is missing); got {shown(spec)}"
        ) from None
    except Exception as exc:  # the user's module failed while it ran
        raise ConfigError(
            f"{key}: importing module {module_name!r} failed: {_first_line(exc)}; "
            f"got {shown(spec)}"
        ) from None
    obj: Any = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            known = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, known, n=1, cutoff=0.5)
            head = f"{module_name}:" + "".join(p + "." for p in parts[:i])
            hint = f"; did you mean {head + close[0]!r}?" if close else ""
            raise ConfigError(
                f"{key}: {head.rstrip(':.')!r} has no attribute {part!r}{hint}; "
                f"got {shown(spec)}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"{key} must name a callable (a function or class); "
            f"{spec!r} is a {type(obj).__name__}"
        )
    path = _source_file(obj, module)
    if path is None or not path.is_file():
        raise ConfigError(
            f"{key}: {spec!r} has no source file to record (a run records the "
            "SHA-256 of the file that defines its model and loss); define it in "
            "a Python file"
        )
    sha = file_sha256(path)
    if recorded is not None and recorded != sha:
        raise ConfigError(
            f"{path} changed since the configuration recorded it ({key} {spec!r} "
            f"is defined there; SHA-256 {recorded[:16]}... recorded in "
            f"{key}_sha256, {sha[:16]}... now): a run resumes, and a Flower node "
            "or Ray worker computes, only with the code it started with; restore "
            f"the file, or start a new run with {key}_sha256 null"
        )
    return Factory(spec, obj, path, sha)


def factory_options(
    obj: Callable[..., Any], passed: tuple[str, ...] = ()
) -> tuple[dict[str, tuple[Any, bool]], set[str], bool] | None:
    """What a callable takes, from its signature.

    Parameters
    ----------
    obj : callable
        A factory (a function, or a class: its ``__init__``).
    passed : tuple of str
        The keywords dpfl passes itself when the callable takes them
        (a model factory's ``input_shape``, ``num_classes``).

    Returns
    -------
    tuple or None
        ``(schema, takes, open)``: each keyword option's ``(type hint,
        required)`` (hints that cannot be resolved read as ``Any``), which of
        ``passed`` it takes, and whether it takes ``**kwargs`` (then any
        option is passed on); ``None`` if it has no readable signature.
    """
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    target = obj.__init__ if inspect.isclass(obj) else obj  # type: ignore[misc]
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # a hint naming what only a type checker imports
        hints = {}
    schema: dict[str, tuple[Any, bool]] = {}
    takes: set[str] = set()
    open_ = False
    for name, p in sig.parameters.items():
        if p.kind is p.VAR_KEYWORD:
            open_ = True
            continue
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            continue
        if name in passed:
            takes.add(name)
            continue
        schema[name] = (hints.get(name, Any), p.default is inspect.Parameter.empty)
    if open_:
        takes.update(passed)
    return schema, takes, open_


def check_factory_options(
    key: str,
    obj: Callable[..., Any],
    options: Mapping[str, Any],
    passed: Mapping[str, str],
) -> dict[str, Any]:
    """Check ``options`` against what factory ``obj`` takes; the checked options.

    Parameters
    ----------
    key : str
        The section (``"model"``): errors name ``key.options.NAME``.
    obj : callable
        The factory.
    options : mapping
        The configured options.
    passed : mapping of str to str
        The keywords dpfl passes itself, each with what sets it (an option
        of that name is refused as a key given twice).

    Raises
    ------
    ConfigError
        On an option it does not take (with the closest one it takes), of the
        wrong type, set by dpfl, or a required one missing.
    """
    from dpfl.experiments.config_schema import check_options

    read = factory_options(obj, tuple(passed))
    for name in options:
        if name in passed:
            raise ConfigError(
                f"{key}.options.{name} is set by {passed[name]}: a key given in two "
                f"places is refused; keep one; got {shown(options[name])}"
            )
    if read is None:
        return dict(options)
    schema, _, open_ = read
    known = dict(schema)
    if open_:  # **kwargs: options it does not name are passed on unchecked
        known.update({k: (Any, False) for k in options if k not in schema})
    checked = check_options(f"{key}.options", options, known, {})
    missing = [
        k for k, (_, required) in schema.items() if required and k not in checked
    ]
    if missing:
        raise ConfigError(
            f"{key}.options.{missing[0]} is required by {key}.factory (it takes "
            f"{', '.join(sorted(schema)) or 'no options'}); got none"
        )
    return checked


def call_factory(
    key: str,
    factory: Factory,
    options: Mapping[str, Any],
    passed: Mapping[str, Any] | None = None,
) -> Any:
    """Call a factory with its options (and the keywords of ``passed`` it takes).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the factory raises; one line naming ``key``, the factory and the
        error.
    """
    read = factory_options(factory.obj, tuple(passed or ()))
    takes = set(passed or ()) if read is None else read[1]
    kwargs = {k: v for k, v in (passed or {}).items() if k in takes}
    try:
        return factory.obj(**kwargs, **options)
    except Exception as exc:
        raise InvalidParameterError(
            f"{key} {factory.spec!r} failed when called with "
            f"{sorted({**kwargs, **options})}: {_first_line(exc)}"
        ) from exc

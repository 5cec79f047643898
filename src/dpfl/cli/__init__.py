"""The ``dpfl`` command line, one module per command group.

:mod:`dpfl.cli.main` is the entry point and finds the command modules
(every module here with an ``add_subcommands`` function: a new command is
one new module);
:mod:`dpfl.cli.flags` reads the flags (domains, one-line errors);
:mod:`dpfl.cli.account` (``account``, ``calibrate``) and
:mod:`dpfl.cli.audit` register the papers' schemes and audits
(:mod:`dpfl.papers`); :mod:`dpfl.cli.train` holds ``train``, ``sweep``,
``reproduce``, ``resume``, ``plot`` and ``demo``; :mod:`dpfl.cli.data`
holds ``data``; :mod:`dpfl.cli.presets` holds ``presets`` (the shipped
configurations).
"""

"""The ``elmo`` subcommands, one module each: every command line lives here, over the library
module or package it runs (``elmo embed`` over :mod:`torchelmo.embed`, ``elmo train`` over
:mod:`torchelmo.train`, ...). Each module has ``add_subcommand(subparsers)``; ``probe_options``
holds the option groups of ``elmo probe``'s tasks."""

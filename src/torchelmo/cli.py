"""The ``elmo`` command line: one subcommand per pipeline, each a thin layer over the library.

Every command lives in :mod:`torchelmo.commands`, a module each, exposing
``add_subcommand(subparsers)``, which registers its parser and sets ``func`` (taking the parsed
args, returning an exit code).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, signals
from .errors import ElmoError
from .signals import Interrupts


def command_modules() -> list:
    """The command modules, in the order `elmo --help` lists them. Imported here, not at the top:
    they load torch, and a Ctrl-C during that is then inside :func:`main`'s handling."""
    from .commands import average, embed, export, info, perplexity, probe, train, vocab
    return [info, vocab, train, perplexity, average, probe, embed, export]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elmo", description="ELMo: deep contextualized word representations")
    parser.add_argument("--version", action="version", version=f"elmo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules():
        module.add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Idle OpenMP threads sleep rather than spin: on a machine whose cores other jobs share, the
    # spinning of threads waiting for a busy core made elmo embed several times slower. Read when
    # torch starts its thread pool, so set before the commands import it (the user's setting wins).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        try:
            return _run(argv)
        finally:
            # Output still buffered is written here, not at exit, where a closed pipe could only
            # be reported as "Exception ignored ... BrokenPipeError". Also covers argparse's
            # SystemExit after --help.
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader left early (`elmo info --list | head -1`): end quietly, as Unix tools do.
        _discard_closed_pipes()
        return 128 + 13   # the shell's status for a tool ended by SIGPIPE


def _discard_closed_pipes() -> None:
    """Point stdout, and stderr if its reader is gone too (``2>&1 | head``), at os.devnull, so
    what is left in their buffers is dropped at exit instead of failing again (the remedy of
    the Python docs' note on SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    try:
        sys.stderr.flush()
    except BrokenPipeError:
        os.dup2(devnull, sys.stderr.fileno())
    os.close(devnull)


def _run(argv: list[str] | None) -> int:
    signals.reset()
    given = sys.argv[1:] if argv is None else argv
    command = f"elmo {given[0]}" if given and not given[0].startswith("-") else "elmo"
    try:
        # A signal is held while torch loads: raised inside an extension's initialisation it
        # can leave the module half loaded, or make the interpreter exit by SIGINT regardless
        # of the status returned here.
        with Interrupts() as held, held.critical():
            parser = build_parser()
            from .runtime import bar_safe_output
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        command = f"elmo {args.command}"
        with bar_safe_output(command):   # warnings and log lines stay off progress bars
            return int(args.func(args) or 0)
    except ElmoError as e:
        message = str(e)
        said = command.split(" ", 1)[-1] + ": "     # the library names its API ("export: ..."): once is enough
        print(f"{command}: error: {message[len(said):] if message.startswith(said) else message}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{command}: error: out of memory (an allocation failed: the machine's memory or this "
              "process's limit is spent); nothing more was written", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if "can't allocate memory" not in str(e) and "not enough memory" not in str(e):
            raise
        print(f"{command}: error: out of memory ({' '.join(str(e).split())[:160]}); nothing more was written",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if signals.work_done():   # the result was complete when the signal came: it stands
            return 0
        print(f"{command}: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The installed ``elmo`` command: :func:`main`, then exit with its status, which a signal
    arriving while the interpreter shuts down can no longer change."""
    status = main()
    signals.ignore_from_now()
    sys.exit(status)


if __name__ == "__main__":
    entry()

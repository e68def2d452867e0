"""``allennlp.common.checks.ConfigurationError``: what AllenNLP raises for input or settings it
rejects (``ElmoEmbedder.embed_file`` and the ``elmo`` command: a blank line)."""

from __future__ import annotations

from ...errors import ElmoError


class ConfigurationError(ElmoError):
    """AllenNLP's name for a rejected configuration; an :class:`~torchelmo.ElmoError` too, so
    torchelmo's own handlers (one line on the command line) treat it as any other."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message   # AllenNLP's attribute

    def __str__(self) -> str:
        return self.message

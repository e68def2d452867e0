"""The library's one exception type, and its warnings pointed at the caller."""

import os
import re
import sys
import warnings

# Characters that would break a message's single line (newlines, carriage returns, other
# controls, Unicode line and paragraph separators), shown as escapes instead.
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with every character that could start a new line shown as its escape (``\\n``)."""
    return _BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class ElmoError(ValueError):
    """Bad input to elmo: a file, dataset, option or batch that is not what it should be.

    The message always names the offending thing (file, dataset, option key, line) and says
    what is wrong, so it can be shown to a user as a single line: a name that holds a newline
    (a model name, a path) is shown with the newline escaped.
    """

    def __str__(self) -> str:
        return one_line(super().__str__())


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _skipped() -> tuple[str, ...]:
    """torchelmo's files, and torch's (its modules' __call__ stands between a user and forward)."""
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None)
    return (_PACKAGE, os.path.dirname(where) + os.sep) if where else (_PACKAGE,)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """:func:`warnings.warn` pointed at the first line outside torchelmo (and torch) that led
    here: the user's call, however deep in the library the warning is raised."""
    skipped = _skipped()
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)

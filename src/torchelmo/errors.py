"""The library's one exception type."""

import re

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

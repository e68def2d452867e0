"""The library's one exception type."""


class ElmoError(ValueError):
    """Bad input to elmo: a file, dataset, option or batch that is not what it should be.

    The message always names the offending thing (file, dataset, option key, line) and says
    what is wrong, so it can be shown to a user as a single line.
    """

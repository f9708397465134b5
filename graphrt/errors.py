class GraphrtError(Exception):
    """A problem with the user's input or environment, explained in one line.

    The CLI prints the message as `error: <message>` and exits non-zero; it never shows a
    traceback for these.
    """


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its class name if it has none), for a one-line report."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

class GraphrtError(Exception):
    """A problem with the user's input or environment, explained in one line.

    The CLI prints the message as `error: <message>` and exits non-zero; it never shows a
    traceback for these.
    """


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its class name if it has none), for a one-line report."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


NAME_WIDTH = 80  # characters of a name a line or a text table shows, the cut marked by "…"


def cut(text: str, width: int = NAME_WIDTH) -> str:
    """`text`, or its first `width` - 1 characters and "…" where it is longer than `width`: a
    name quoted in a line is whatever a trace's program chose, megabytes of it at worst."""
    return text if len(text) <= width else text[:width - 1] + "…"

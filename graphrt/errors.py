class GraphrtError(Exception):
    """A problem with the user's input or environment, explained in one line.

    The CLI prints the message as `error: <message>` and exits non-zero; it never shows a
    traceback for these.
    """

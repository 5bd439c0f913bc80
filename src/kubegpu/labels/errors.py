"""The one error of label computation."""


class LabelError(Exception):
    """Labels cannot be computed; GFD exits on these. The message says what failed."""

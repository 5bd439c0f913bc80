"""Text from a client, made safe to put in a log line or an error message.

Device IDs arrive from whoever can reach the plugin's socket. Written out as they come, an ID holding a
newline forges a log line, one holding terminal escapes rewrites the operator's screen, and a 20 KB one
fills the log (or the gRPC status, which the kubelet then refuses). Every ID we quote goes through here.

- `quote_id` always quotes, the way Python's `repr` does: quotes around it, control and other unprintable
  characters (line and paragraph separators, bidi overrides included) escaped as `\\n`, `\\x1b`, `\\u2028`;
  past `limit` characters it is cut and the full length is said.
- `plain_id` leaves a printable ID of at most `limit` characters exactly as it is, so that texts we share
  with NVIDIA (`unknown device: <id>`) stay byte-identical for every ID a kubelet can send, and falls back to
  `quote_id` for anything else.
"""

from __future__ import annotations

DEFAULT_LIMIT = 64  # the kubelet's device IDs are at most 63 characters: a real one is never cut
# Paths and setting values a user gave, echoed in an error: cut past this (the length said), so a file pasted
# into an env var cannot fill the line; real ones are far shorter.
VALUE_LIMIT = 256


def quote_id(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """`text` as a quoted, escaped literal, at most `limit` characters of it (then `...` and its length)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def plain_id(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """`text` unchanged when it is printable and at most `limit` characters long, else `quote_id(text)`."""
    if len(text) <= limit and text.isprintable():
        return text
    return quote_id(text, limit)


def quote_ids(texts: list[str], *, shown: int = 3, limit: int = DEFAULT_LIMIT) -> str:
    """The first `shown` of `texts`, each `quote_id`-ed, then how many more there are."""
    out = ", ".join(quote_id(t, limit) for t in texts[:shown])
    if len(texts) > shown:
        out += f" and {len(texts) - shown} more"
    return out

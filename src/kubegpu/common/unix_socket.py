"""The kernel's limit on a unix socket's path, checked where a setting names one.

`sun_path` holds 108 bytes including the terminating NUL, so a path of more than 107 bytes cannot be bound or
dialled: gRPC then fails on every attempt, which the daemons' retry loops turned into a plugin waiting
forever for a kubelet it can never reach. A setting that builds such a path is refused at start instead.
"""

from __future__ import annotations

import os

from kubegpu.common.quoting import VALUE_LIMIT, quote_id

MAX_SOCKET_PATH = 107  # bytes: sun_path is 108 including the terminating NUL


def socket_path_problem(setting: str, given: str, socket: str, what: str = "") -> str | None:
    """Why `socket`, built from the value `given` of `setting`, cannot be a unix socket's path, or None.

    `what` names the built socket when it is not `given` itself ("the plugin's socket beside it"). The path is
    made absolute first, as gRPC binds and dials it. The text names the setting and the fix, on one line.
    """
    length = len(os.fsencode(os.path.abspath(socket)))
    if length <= MAX_SOCKET_PATH:
        return None
    built = f"{what} {quote_id(socket, VALUE_LIMIT)} would be" if what else "it is"
    return (
        f"invalid {setting} {quote_id(given, VALUE_LIMIT)}: {built} {length} bytes, over the "
        f"{MAX_SOCKET_PATH} a unix socket's path may hold; give a shorter path"
    )

"""What a request to the simulated API server was (ApiCall, kept for assertions) and what the server does
to requests on purpose (Fault)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request as it arrived: method, path, query (last value of each key) and JSON body."""

    method: str
    path: str
    query: Mapping[str, str]
    body: Any = None


@dataclass(frozen=True, slots=True)
class Fault:
    """What the server does with the requests whose path contains `path_contains` ("": all of them): hold
    each `hang_s` seconds first, then answer `status` (500, 429, 503) with its Status body, or the request
    as usual when `status` is 0."""

    status: int = 0
    hang_s: float = 0.0
    path_contains: str = ""

    def applies(self, path: str) -> bool:
        return self.path_contains in path


def flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")  # the Python client sends `True`

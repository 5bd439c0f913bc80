"""The API's rules for names in DRA objects, with the real error texts: DNS labels and subdomains, C
identifiers, driver names and qualified attribute/capacity IDs (`[domain/]identifier`)."""

from __future__ import annotations

import re
from typing import Any

from kubegpu.common.k8s_names import is_dns1123_subdomain

from .errors import FieldError

MAX_DRIVER_NAME = 63
MAX_ID = 32
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DNS_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric "
    "characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is "
    "'[A-Za-z_][A-Za-z0-9_]*')"
)


def driver_name(value: Any, path: str) -> list[FieldError]:
    if not value:
        return [FieldError.required(path)]
    if len(str(value)) > MAX_DRIVER_NAME:
        return [FieldError.too_long(path, MAX_DRIVER_NAME)]
    if not is_dns1123_subdomain(str(value)):
        return [FieldError.invalid(path, value, DNS_SUBDOMAIN_MSG)]
    return []


def qualified_id(name: str, path: str) -> list[FieldError]:
    domain, _, ident = name.rpartition("/")
    errors = []
    if domain:
        if len(domain) > MAX_DRIVER_NAME:
            errors.append(FieldError.too_long(path, MAX_DRIVER_NAME))
        elif not is_dns1123_subdomain(domain):
            errors.append(FieldError.invalid(path, domain, DNS_SUBDOMAIN_MSG))
    if not ident:
        errors.append(FieldError.required(path, "name required"))
    elif len(ident) > MAX_ID:
        errors.append(FieldError.too_long(path, MAX_ID))
    elif not C_IDENTIFIER.fullmatch(ident):
        errors.append(FieldError.invalid(path, ident, C_IDENTIFIER_MSG))
    return errors

"""The `device` variable of a DRA selector, as a CEL expression sees it (cel.py says what that is):
`device.driver`, and `device.attributes` / `device.capacity` by domain, with an unknown domain an empty map.
Each device's map is assembled once, and only when an expression needs it; CelError, the error of every
step of DRA's CEL, is raised here first (a value CEL cannot take).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

from celpy import celtypes

from kubegpu.resourceapi.cel_library import Quantity, Semver, parse_semver


class CelError(Exception):
    """A selector that does not compile, or fails when evaluated (which aborts allocation)."""


MISSING = object()  # DeviceActivation.plain() for a name the device does not have


class _DomainMap(celtypes.MapType):
    """device.attributes / device.capacity: an unknown domain is an empty map, not an error."""

    def __missing__(self, key: Any) -> Any:
        return celtypes.MapType()


def _plain_value(value: Mapping[str, Any]) -> tuple[str, Any]:
    """An attribute value as (kind, Python value): what its CEL value is made of."""
    if "int" in value:
        return "int", int(value["int"])
    if "bool" in value:
        return "bool", bool(value["bool"])
    if "string" in value:
        return "string", str(value["string"])
    if "version" in value:
        return "version", value["version"]
    raise CelError("unsupported attribute value")


@lru_cache(maxsize=4096)
def _cel_value(kind: str, value: Any) -> Any:
    """The CEL value of one attribute value; made once per distinct value (they are immutable, and a cluster
    repeats the same few on every device: parsing a semantic version costs more than the rest)."""
    if kind == "int":
        return celtypes.IntType(value)
    if kind == "bool":
        return celtypes.BoolType(value)
    if kind == "string":
        return celtypes.StringType(value)
    parsed = parse_semver(value)
    if parsed is None:
        raise CelError(f"parse semantic version: {value!r} is not a semantic version")
    return Semver(parsed)


def _attribute_value(value: Mapping[str, Any]) -> Any:
    kind, plain = _plain_value(value)
    try:
        return _cel_value(kind, plain)
    except TypeError:  # an unhashable value (a malformed object): made without the cache
        return _cel_value.__wrapped__(kind, plain)


@lru_cache(maxsize=4096)
def _capacity_value(text: str) -> Quantity:
    return Quantity(text)


def _split_name(name: str, driver: str) -> tuple[str, str]:
    domain, _, ident = name.rpartition("/")
    return (domain or driver), ident


class DeviceActivation(Mapping[str, Any]):
    """The `device` variable of one device: its CEL map is assembled only when an expression is evaluated
    on it. A selector that reads only named attributes and capacities finds its remembered answer from
    `plain()` values instead (a cluster repeats the same GPU model: most devices never need their map)."""

    __slots__ = ("_attributes", "_capacity", "_device", "answers", "driver")

    def __init__(
        self,
        driver: str,
        attributes: Mapping[str, Mapping[str, Any]],
        capacity: Mapping[str, Mapping[str, Any]],
    ) -> None:
        for name, value in attributes.items():  # a value CEL cannot take fails now, whatever reads it
            if "int" in value:
                if type(value["int"]) is not int:
                    int(value["int"])  # as _plain_value converts it (and fails)
            elif "bool" in value or "string" in value:
                pass
            else:
                try:
                    _attribute_value(value)  # a version (parsed once per distinct text), or unsupported
                except CelError as err:
                    raise CelError(f"attribute {name}: {err}") from None
        self.driver = driver
        self._attributes = attributes
        self._capacity = capacity
        self._device: celtypes.MapType | None = None
        self.answers: dict[str, bool | str] = {}  # each selector's answer (or error) for this device

    @property
    def device(self) -> celtypes.MapType:
        if self._device is None:
            self._device = self._assemble()
        return self._device

    def plain(self, what: str, domain: str, name: str) -> Any:
        """device.<what>[domain][name] as plain (kind, value), or MISSING; the same key as the map has."""
        raw = self._attributes if what == "attributes" else self._capacity
        if "/" in name:
            return MISSING  # a name with a slash splits into another domain: no such key in the map
        names = [
            k
            for k in (
                (f"{domain}/{name}", name, f"/{name}") if domain == self.driver else (f"{domain}/{name}",)
            )
            if k in raw
        ]
        if not names:
            return MISSING
        if len(names) > 1:  # "x" and "<driver>/x" both: the map keeps the later one
            order = {k: i for i, k in enumerate(raw)}
            names.sort(key=order.__getitem__)
        value = raw[names[-1]]
        return _plain_value(value) if what == "attributes" else ("quantity", str(value.get("value")))

    def _assemble(self) -> celtypes.MapType:
        maps: dict[str, dict[str, celtypes.MapType]] = {"attributes": {}, "capacity": {}}
        for name, value in self._attributes.items():
            domain, ident = _split_name(name, self.driver)
            maps["attributes"].setdefault(domain, celtypes.MapType())[celtypes.StringType(ident)] = (
                _attribute_value(value)
            )
        for name, value in self._capacity.items():
            domain, ident = _split_name(name, self.driver)
            # Quantity is a CEL value of its own (an opaque type with methods), which celpy's MapType accepts
            # at run time but its annotations do not list.
            maps["capacity"].setdefault(domain, celtypes.MapType())[celtypes.StringType(ident)] = (
                _capacity_value(str(value.get("value")))  # type: ignore[assignment]
            )
        return celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(self.driver),
                **{
                    celtypes.StringType(what): _DomainMap({celtypes.StringType(k): v for k, v in by.items()})
                    for what, by in maps.items()
                },
            }
        )

    def __getitem__(self, key: str) -> Any:
        if key != "device":
            raise KeyError(key)
        return self.device

    def __iter__(self) -> Iterator[str]:
        return iter(("device",))

    def __len__(self) -> int:
        return 1


# Activations of the devices seen last, by the identity of their (immutable) attribute and capacity maps:
# explain and the allocator judge the same device objects on every pass.
_ACTIVATIONS: dict[tuple[str, int, int], tuple[Any, Any, DeviceActivation]] = {}
_ACTIVATIONS_LIMIT = 65536


def device_activation(
    driver: str, attributes: Mapping[str, Mapping[str, Any]], capacity: Mapping[str, Mapping[str, Any]]
) -> DeviceActivation:
    """The `device` variable for one device (v1 shapes: attributes {name: {int|bool|string|version}},
    capacity {name: {value}}). Build it once per device and reuse it for every selector; the same maps
    (the same objects) give the same activation back without building it again. CelError for a value CEL
    cannot take (an invalid semantic version)."""
    key = (driver, id(attributes), id(capacity))
    cached = _ACTIVATIONS.get(key)
    if cached is not None and cached[0] is attributes and cached[1] is capacity:
        return cached[2]
    activation = DeviceActivation(driver, attributes, capacity)
    if len(_ACTIVATIONS) >= _ACTIVATIONS_LIMIT:
        _ACTIVATIONS.clear()
    _ACTIVATIONS[key] = (attributes, capacity, activation)  # holding the maps keeps their ids unique
    return activation

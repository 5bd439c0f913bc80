"""The DRA protos match the kubelet's wire contracts (docs/reference/dra.md §1.1-1.2).

Names and numbers below are written out from the reference tables, not read from the code: a renamed
package, service or field changes the method path or the wire format and the kubelet would not talk to us.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor

from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health
from kubegpu.api.pluginregistration.v1 import api_pb2 as registration

REGISTRATION_FIELDS = [
    ("PluginInfo", "type", 1, FieldDescriptor.TYPE_STRING, False),
    ("PluginInfo", "name", 2, FieldDescriptor.TYPE_STRING, False),
    ("PluginInfo", "endpoint", 3, FieldDescriptor.TYPE_STRING, False),
    ("PluginInfo", "supported_versions", 4, FieldDescriptor.TYPE_STRING, True),
    ("RegistrationStatus", "plugin_registered", 1, FieldDescriptor.TYPE_BOOL, False),
    ("RegistrationStatus", "error", 2, FieldDescriptor.TYPE_STRING, False),
]


@pytest.mark.parametrize(("message", "field", "number", "kind", "repeated"), REGISTRATION_FIELDS)
def test_registration_fields(message: str, field: str, number: int, kind: int, repeated: bool) -> None:
    descriptor = registration.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (descriptor.number, descriptor.type, _is_repeated(descriptor)) == (number, kind, repeated)


def test_registration_service_path() -> None:
    assert registration.DESCRIPTOR.package == "pluginregistration"
    service = registration.DESCRIPTOR.services_by_name["Registration"]
    assert [m.full_name for m in service.methods] == [
        "pluginregistration.Registration.GetInfo",
        "pluginregistration.Registration.NotifyRegistrationStatus",
    ]
    assert registration.DESCRIPTOR.message_types_by_name["InfoRequest"].fields == []
    assert registration.DESCRIPTOR.message_types_by_name["RegistrationStatusResponse"].fields == []


# (message, field, number, repeated) shared by v1 and v1beta1.
DRA_FIELDS = [
    ("NodePrepareResourcesRequest", "claims", 1, True),
    ("NodePrepareResourcesResponse", "claims", 1, True),  # a map is a repeated entry message
    ("NodePrepareResourceResponse", "devices", 1, True),
    ("NodePrepareResourceResponse", "error", 2, False),
    ("Device", "request_names", 1, True),
    ("Device", "pool_name", 2, False),
    ("Device", "device_name", 3, False),
    ("Device", "cdi_device_ids", 4, True),
    ("NodeUnprepareResourcesRequest", "claims", 1, True),
    ("NodeUnprepareResourcesResponse", "claims", 1, True),
    ("NodeUnprepareResourceResponse", "error", 1, False),
    ("Claim", "namespace", 1, False),
    ("Claim", "uid", 2, False),
    ("Claim", "name", 3, False),
]


@pytest.mark.parametrize("module", [dra_v1, dra_v1beta1], ids=["v1", "v1beta1"])
@pytest.mark.parametrize(("message", "field", "number", "repeated"), DRA_FIELDS)
def test_dra_fields(module: object, message: str, field: str, number: int, repeated: bool) -> None:
    descriptor = module.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]  # type: ignore[attr-defined]
    assert (descriptor.number, _is_repeated(descriptor)) == (number, repeated)


@pytest.mark.parametrize("module", [dra_v1, dra_v1beta1], ids=["v1", "v1beta1"])
def test_dra_response_maps_are_keyed_by_claim_uid_string(module: object) -> None:
    for message, value in [
        ("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
        ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"),
    ]:
        entry = module.DESCRIPTOR.message_types_by_name[message].fields_by_name["claims"].message_type  # type: ignore[attr-defined]
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        assert entry.fields_by_name["value"].message_type.name == value


def test_share_id_is_v1_only_and_optional() -> None:
    share_id = dra_v1.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"]
    assert share_id.number == 5
    assert share_id.has_presence  # proto3 `optional`: unset is distinguishable from ""
    assert "share_id" not in dra_v1beta1.DESCRIPTOR.message_types_by_name["Device"].fields_by_name


@pytest.mark.parametrize(
    ("module", "package"),
    [(dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1"), (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1")],
)
def test_dra_method_paths(module: object, package: str) -> None:
    assert module.DESCRIPTOR.package == package  # type: ignore[attr-defined]
    service = module.DESCRIPTOR.services_by_name["DRAPlugin"]  # type: ignore[attr-defined]
    assert [m.full_name for m in service.methods] == [
        f"{package}.DRAPlugin.NodePrepareResources",
        f"{package}.DRAPlugin.NodeUnprepareResources",
    ]


def test_v1_and_v1beta1_messages_are_wire_compatible() -> None:
    """A v1beta1 request parses as v1 and back: the v1beta1 adapter can re-serialize instead of copying."""
    request = dra_v1beta1.NodePrepareResourcesRequest(
        claims=[dra_v1beta1.Claim(namespace="ns", uid="uid-1", name="claim")]
    )
    as_v1 = dra_v1.NodePrepareResourcesRequest.FromString(request.SerializeToString())
    assert (as_v1.claims[0].namespace, as_v1.claims[0].uid, as_v1.claims[0].name) == ("ns", "uid-1", "claim")


HEALTH_FIELDS = [
    ("NodeWatchResourcesResponse", "devices", 1),
    ("DeviceIdentifier", "pool_name", 1),
    ("DeviceIdentifier", "device_name", 2),
    ("DeviceHealth", "device", 1),
    ("DeviceHealth", "health", 2),
    ("DeviceHealth", "last_updated_time", 3),
    ("DeviceHealth", "health_check_timeout_seconds", 4),
    ("DeviceHealth", "message", 5),
]


@pytest.mark.parametrize(("message", "field", "number"), HEALTH_FIELDS)
def test_health_fields(message: str, field: str, number: int) -> None:
    assert health.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number


def test_health_service_and_enum() -> None:
    assert health.DESCRIPTOR.package == "v1alpha1"
    method = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert method.full_name == "v1alpha1.DRAResourceHealth.NodeWatchResources"
    assert method.server_streaming and not method.client_streaming
    assert {v.name: v.number for v in health.DESCRIPTOR.enum_types_by_name["HealthStatus"].values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    return bool(descriptor.is_repeated)

"""The extended-resource-name rule (the kubelet simulator's, lint's and explain's), against the
kube-apiserver's `IsExtendedResourceName`.

Each vector is written out from the API server's behaviour (k8s.io/kubernetes pkg/apis/core/helper and
apimachinery's IsQualifiedName / IsDNS1123Subdomain): a name is extended when it is not native (it has a
"/" and is outside kubernetes.io), does not start with "requests.", and "requests." + name is a qualified
name (a lower-case DNS-1123 subdomain of at most 253 characters, "/", then 1-63 of [A-Za-z0-9_.-] with
alphanumeric ends).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kubegpu.common.k8s_names import is_extended_resource_name

EXTENDED = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-3g.40gb.shared",
    "vendor.io/fpga_A1",
    "my-vendor.example.com/gpu",
    "example.com/A_b.c-9",  # the name part may be upper case; only the prefix may not
    "a/b",
    "1.2.3/x",
    "example.com/" + "x" * 63,
    "a" * 244 + "/x",  # "requests." + 244 is 253 characters: the longest subdomain
    "requests/gpu",  # "requests" without the dot is an ordinary prefix
    "kubernetes.iox/gpu",
]

NOT_EXTENDED = [
    "gpu",  # unprefixed: native
    "cpu",
    "kubernetes.io/gpu",
    "foo.kubernetes.io/gpu",  # anywhere in kubernetes.io
    "requests.nvidia.com/gpu",  # a quota name
    "example.com/",
    "/gpu",
    "example.com/-gpu",
    "example.com/gpu-",
    "example.com/" + "x" * 64,
    "a" * 245 + "/x",  # "requests." + 245 is 254 characters
    "example.com/a/b",
    "example.com/g pu",
    "example.com/g:pu",
    "example.com/gp\u00fc",
    "example_com/gpu",
    "example.com-/gpu",
    # The five names the toolkit's own copy used to accept, against the API server:
    "Example.com/gpu",  # the prefix is a lower-case DNS-1123 subdomain
    "example..com/gpu",  # an empty DNS label
    "-example.com/gpu",  # a label starts with an alphanumeric
    "x" * 250 + "/gpu",  # a 250-character prefix: "requests." makes it 259 > 253
    "example.com/gpu\n",  # Go's $ does not match before a trailing newline
]


@pytest.mark.parametrize("name", EXTENDED)
def test_extended(name: str) -> None:
    assert is_extended_resource_name(name)


@pytest.mark.parametrize("name", NOT_EXTENDED)
def test_not_extended(name: str) -> None:
    assert not is_extended_resource_name(name)


@given(st.text())
def test_an_extended_name_has_one_short_prefix_and_a_short_name(name: str) -> None:
    if is_extended_resource_name(name):
        prefix, name_part = name.split("/")
        assert 1 <= len(prefix) <= 244 and prefix == prefix.lower()
        assert 1 <= len(name_part) <= 63
        assert name.isascii() and not name.startswith("requests.")


_LABEL = r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?"
domains = st.from_regex(rf"{_LABEL}(\.{_LABEL}){{0,3}}", fullmatch=True)
names = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", fullmatch=True)


@given(domains, names)
def test_any_well_formed_domain_and_name_is_extended(domain: str, name: str) -> None:
    resource = f"{domain}/{name}"
    assume("kubernetes.io/" not in resource and not resource.startswith("requests."))
    assert is_extended_resource_name(resource)


@given(st.text(alphabet=st.characters(exclude_characters="/")))
def test_unprefixed_names_are_never_extended(name: str) -> None:
    assert not is_extended_resource_name(name)


@given(domains, names, st.sampled_from("ABZ_ +:"), st.integers(min_value=0))
def test_a_bad_character_in_the_domain_is_not_extended(domain: str, name: str, bad: str, at: int) -> None:
    at %= len(domain) + 1
    assert not is_extended_resource_name(f"{domain[:at]}{bad}{domain[at:]}/{name}")


@given(st.text(), st.text())
def test_anything_under_kubernetes_io_is_not_extended(before: str, after: str) -> None:
    assert not is_extended_resource_name(f"{before}kubernetes.io/{after}")


def test_the_kubelet_simulator_uses_this_rule() -> None:
    from kubegpu import kubeletsim
    from kubegpu.kubeletsim import predicate, registration

    assert kubeletsim.is_extended_resource_name is is_extended_resource_name
    assert registration.is_extended_resource_name is is_extended_resource_name
    assert predicate.is_extended_resource_name is is_extended_resource_name

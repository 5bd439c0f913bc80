from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.node.xids import (
    DEFAULT_IGNORED_XIDS,
    XidAction,
    XidPolicy,
    describe_xid,
    xid_classifier,
    xid_policy,
)
from kubegpu.settings.env import DaemonEnv


def policy_from_env(env: dict[str, str]) -> XidPolicy:
    """The policy the daemon builds from these env vars (read and typed by the settings package)."""
    settings = DaemonEnv.from_environ(env)
    return xid_policy(settings.disable_healthchecks, settings.enable_healthchecks)


def _ignored(env: dict[str, str], xid: int) -> bool:
    return not policy_from_env(env).is_critical(xid)


def test_defaults_ignore_application_xids() -> None:
    for xid in (13, 31, 43, 45, 68, 109):
        assert _ignored({}, xid)
    assert not _ignored({}, 79)
    assert not _ignored({}, 555)  # NVIDIA's test vector


def test_disable_all_and_aliases() -> None:
    for value in ("all", "xids", " ALL ", "79,all"):
        policy = policy_from_env({"DP_DISABLE_HEALTHCHECKS": value})
        assert not policy.is_critical(79)
        assert not policy.checks_enabled


def test_enable_all_overrides_everything() -> None:
    policy = policy_from_env({"DP_ENABLE_HEALTHCHECKS": "all"})
    assert all(policy.is_critical(x) for x in DEFAULT_IGNORED_XIDS | {79})
    both = policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "all"})
    assert both.is_critical(13) and both.checks_enabled


def test_enable_overrides_disable_for_listed_ids() -> None:
    assert not _ignored({"DP_DISABLE_HEALTHCHECKS": "11", "DP_ENABLE_HEALTHCHECKS": "11"}, 11)
    assert not _ignored({"DP_ENABLE_HEALTHCHECKS": "13"}, 13)
    assert _ignored({"DP_DISABLE_HEALTHCHECKS": "79, 48"}, 48)


def test_disable_all_with_specific_enable_checks_those_only() -> None:
    # NVIDIA would not start health checks at all here; we check exactly what was enabled.
    policy = policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"})
    assert policy.checks_enabled
    assert policy.is_critical(79)
    assert not policy.is_critical(48)


def test_malformed_entries_are_ignored() -> None:
    policy = policy_from_env({"DP_DISABLE_HEALTHCHECKS": "abc,-4,,79"})
    assert not policy.is_critical(79)
    assert policy.is_critical(48)


@given(st.text(max_size=40), st.text(max_size=40), st.integers(min_value=0, max_value=300))
def test_any_env_text_parses(disable: str, enable: str, xid: int) -> None:
    policy = policy_from_env({"DP_DISABLE_HEALTHCHECKS": disable, "DP_ENABLE_HEALTHCHECKS": enable})
    assert isinstance(policy.is_critical(xid), bool)


def test_describe() -> None:
    assert describe_xid(79) == "XID 79 (GPU has fallen off the bus)"
    assert describe_xid(1234) == "XID 1234"


# What each XID calls for under NVIDIA's env vars, with the built-in catalog: 13 restart_app, 45 ignore,
# 48 and 79 reset_gpu, 154 reboot_node; 999 is in no catalog (NVIDIA marks it: reset_gpu).
IGNORE, RESTART, RESET, REBOOT = (
    XidAction.IGNORE,
    XidAction.RESTART_APP,
    XidAction.RESET_GPU,
    XidAction.REBOOT_NODE,
)


@pytest.mark.parametrize(
    ("env", "actions"),
    [
        ({}, {13: RESTART, 45: IGNORE, 48: RESET, 79: RESET, 154: REBOOT, 999: RESET}),
        # Ignored by NVIDIA's rules: never marks the GPU; the catalog's milder advice is kept.
        ({"DP_DISABLE_HEALTHCHECKS": "48,154,999"}, {48: IGNORE, 154: IGNORE, 999: IGNORE, 79: RESET}),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, {13: RESTART, 45: IGNORE, 79: IGNORE, 154: IGNORE}),
        # Enabled: always marks the GPU, with the catalog's action when that marks it too.
        ({"DP_ENABLE_HEALTHCHECKS": "13,45,154"}, {13: RESET, 45: RESET, 154: REBOOT, 31: RESTART}),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, {13: RESET, 45: RESET, 79: RESET, 154: REBOOT, 999: RESET}),
        (
            {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "154,13"},
            {154: REBOOT, 13: RESET, 79: IGNORE},
        ),
    ],
)
def test_the_action_each_xid_calls_for(env: dict[str, str], actions: dict[int, XidAction]) -> None:
    classifier = xid_classifier(DaemonEnv.from_environ(env))
    assert {xid: classifier.action(xid) for xid in actions} == actions


def test_a_classifier_describes_xids_from_its_catalog() -> None:
    classifier = xid_classifier(DaemonEnv.from_environ({}))
    assert classifier.describe(154) == (
        "XID 154 (GPU recovery action changed: the driver asks for a node reboot)"
    )
    assert classifier.meaning(999) == "" and classifier.describe(999) == "XID 999"


def test_a_malformed_entry_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    policy_from_env({"DP_DISABLE_HEALTHCHECKS": "abc,79", "DP_ENABLE_HEALTHCHECKS": "x1"})
    assert [r.getMessage() for r in caplog.records] == [
        "DP_DISABLE_HEALTHCHECKS: ignoring 'abc', which is not an XID number (use e.g. 79 or all)",
        "DP_ENABLE_HEALTHCHECKS: ignoring 'x1', which is not an XID number (use e.g. 79 or all)",
    ]

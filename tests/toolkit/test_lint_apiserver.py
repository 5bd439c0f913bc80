"""`kubegpu lint` refuses what the API server refuses, in the API server's words: negative and fractional
GPU quantities, quantities it cannot parse, and pod counts (replicas, parallelism, completions) that are
negative or not whole numbers. The expected texts are apimachinery's, written out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kubegpu.toolkit.cli import lint

QUANTITY_RE = "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
NOT_A_STRING = (
    'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal string into '
    "Go struct field DeploymentSpec.spec.replicas of type int32"
)


def run(text: str) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(lint, ["-", "--json"], input=text)
    return result.exit_code, json.loads(result.output)["findings"]


def pod(limits: str) -> str:
    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\nspec:\n  containers:\n"
        f"  - name: cuda\n    image: cuda\n    resources:\n      limits: {limits}\n"
    )


def deployment(replicas: str, kind: str = "Deployment", api: str = "apps/v1") -> str:
    return (
        f"apiVersion: {api}\nkind: {kind}\nmetadata: {{name: d}}\nspec:\n  replicas: {replicas}\n"
        "  template:\n    spec:\n      containers:\n      - name: c\n        image: x\n"
        "        resources: {limits: {nvidia.com/gpu: 1}}\n"
    )


def test_a_negative_gpu_count_is_an_error_with_the_api_servers_words() -> None:
    code, findings = run(pod("{nvidia.com/gpu: -1}"))
    assert code == 1
    (finding,) = findings
    assert finding["rule"] == "KG015" and finding["severity"] == "error" and finding["line"] == 9
    assert finding["message"].endswith(
        'spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "-1": '
        "must be greater than or equal to 0"
    )


def test_negative_quantities_of_any_resource_and_in_requests_too() -> None:
    _, findings = run(pod("{cpu: '-500m'}\n      requests: {memory: -1Gi}"))
    messages = sorted(f["message"].split("refuses it: ")[1] for f in findings if f["rule"] == "KG015")
    assert messages == [
        'spec.containers[0].resources.limits[cpu]: Invalid value: "-500m": '
        "must be greater than or equal to 0",
        'spec.containers[0].resources.requests[memory]: Invalid value: "-1Gi": '
        "must be greater than or equal to 0",
    ]


def test_a_fractional_gpu_quotes_the_canonical_value() -> None:
    _, findings = run(pod("{nvidia.com/gpu: 0.5}"))
    (finding,) = findings
    assert finding["rule"] == "KG003"
    assert finding["message"].endswith(
        'spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be an integer'
    )


@pytest.mark.parametrize(
    ("value", "apiserver"),
    [
        ("one", f"quantities must match the regular expression {QUANTITY_RE}"),
        ("'1 '", f"quantities must match the regular expression {QUANTITY_RE}"),
        ("true", f"quantities must match the regular expression {QUANTITY_RE}"),
        ("2GB", f"quantities must match the regular expression {QUANTITY_RE}"),
        ("1K", "unable to parse quantity's suffix"),
    ],
)
def test_quantities_that_do_not_parse_say_what_the_api_server_answers(value: str, apiserver: str) -> None:
    code, findings = run(pod(f"{{nvidia.com/gpu: {value}}}"))
    assert code == 1
    (finding,) = findings
    assert finding["rule"] == "KG004"
    assert finding["message"].endswith(
        f'the API server refuses the object: Pod in version "v1" cannot be handled as a Pod: {apiserver}'
    )


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        ('"two"', NOT_A_STRING),
        ('"2"', NOT_A_STRING),
        (
            "1.5",
            'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal number 1.5 '
            "into Go struct field DeploymentSpec.spec.replicas of type int32",
        ),
        (
            "true",
            'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal bool into '
            "Go struct field DeploymentSpec.spec.replicas of type int32",
        ),
        (
            "3000000000",
            'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal number '
            "3000000000 into Go struct field DeploymentSpec.spec.replicas of type int32",
        ),
        ("-1", "spec.replicas: Invalid value: -1: must be greater than or equal to 0"),
    ],
)
def test_bad_replicas_are_errors_in_the_api_servers_words(replicas: str, message: str) -> None:
    code, findings = run(deployment(replicas))
    assert code == 1
    (finding,) = findings
    assert (finding["rule"], finding["line"], finding["path"]) == ("KG016", 5, "spec.replicas")
    assert finding["message"].endswith(message)


@pytest.mark.parametrize("replicas", ["0", "3", "2.0", "null"])
def test_good_replicas_pass(replicas: str) -> None:
    assert run(deployment(replicas)) == (0, [])


@pytest.mark.parametrize(
    ("kind", "api", "struct"),
    [
        ("StatefulSet", "apps/v1", "StatefulSetSpec"),
        ("ReplicaSet", "apps/v1", "ReplicaSetSpec"),
        ("ReplicationController", "v1", "ReplicationControllerSpec"),
    ],
)
def test_every_kind_with_replicas_is_checked(kind: str, api: str, struct: str) -> None:
    _, findings = run(deployment("two", kind, api))
    assert [f["message"].split("refuses the object: ")[1] for f in findings] == [
        f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot unmarshal string into Go struct '
        f"field {struct}.spec.replicas of type int32"
    ]


def test_job_and_cronjob_parallelism_and_completions() -> None:
    job = (
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  parallelism: -2\n"
        "  completions: '4'\n  template:\n    spec:\n      containers: [{name: c, image: x}]\n"
    )
    cron = (
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec:\n  schedule: '@daily'\n"
        "  jobTemplate:\n    spec:\n      parallelism: 1\n      completions: -1\n      template:\n"
        "        spec:\n          containers: [{name: c, image: x}]\n"
    )
    _, findings = run(job + "---\n" + cron)
    assert [(f["object"], f["line"], f["message"].split("refuses ")[1]) for f in findings] == [
        ("Job/j", 5, "it: spec.parallelism: Invalid value: -2: must be greater than or equal to 0"),
        (
            "Job/j",
            6,
            'the object: Job in version "v1" cannot be handled as a Job: json: cannot unmarshal string into '
            "Go struct field JobSpec.spec.completions of type int32",
        ),
        (
            "CronJob/c",
            19,
            "it: spec.jobTemplate.spec.completions: Invalid value: -1: must be greater than or equal to 0",
        ),
    ]


def test_inside_a_list_the_message_names_the_objects_own_field() -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [json.loads(json.dumps({"apiVersion": "apps/v1", "kind": "Deployment"}))],
    }
    listed["items"][0].update(
        metadata={"name": "d"},
        spec={"replicas": -1, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    )
    _, findings = run(json.dumps(listed))
    (finding,) = findings
    assert finding["path"] == "items[0].spec.replicas"
    assert finding["message"].endswith("spec.replicas: Invalid value: -1: must be greater than or equal to 0")

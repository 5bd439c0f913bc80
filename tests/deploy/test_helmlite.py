"""The chart renderer's Go-template semantics, case by case, against what Helm (text/template + sprig)
prints for the same template. The expected strings were worked out from Go's and sprig's documented rules."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import helmlite


def run(template: str, values: dict[str, Any] | None = None, **extra: Any) -> str:
    defines: dict[str, list[Any]] = {}
    nodes = helmlite._parse(template, "t", defines)
    top = {"Values": values or {}, "Release": {"Name": "rel", "Namespace": "ns"}, **extra}
    return helmlite.Renderer(defines).run(nodes, top, helmlite._Scope(top))


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        ("a\n  {{- .Values.x }}\nb", {"x": 1}, "a1\nb"),
        ("a {{ .Values.x -}}  \n  b", {"x": "v"}, "a vb"),
        ("{{/* gone */}}x{{- /* also */ -}} y", {}, "xy"),
        ("[{{ .Values.missing }}]", {}, "[]"),
        ("{{ if .Values.a }}A{{ else if .Values.b }}B{{ else }}C{{ end }}", {"b": [1]}, "B"),
        ("{{ if .Values.a }}A{{ else }}C{{ end }}", {"a": {}}, "C"),  # empty map is false
        ("{{ if .Values.a }}A{{ end }}", {"a": 0}, ""),
        ("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": {"k": "v"}}, "v"),
        ("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": None}, "none"),
        ("{{ range $k, $v := .Values.m }}{{ $k }}={{ $v }};{{ end }}", {"m": {"b": 2, "a": 1}}, "a=1;b=2;"),
        ("{{ range .Values.l }}<{{ . }}>{{ else }}empty{{ end }}", {"l": []}, "empty"),
        ("{{ range $i, $v := .Values.l }}{{ $i }}{{ $v }}{{ end }}", {"l": ["x", "y"]}, "0x1y"),
        ("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}", {}, "2"),
        ("{{ $.Release.Name }}/{{ .Release.Namespace }}", {}, "rel/ns"),
        ('{{ default "d" .Values.x }}|{{ .Values.y | default "d" }}', {"x": "", "y": "set"}, "d|set"),
        ("{{ .Values.b | quote }} {{ quote .Values.s }}", {"b": True, "s": 'a"b'}, '"true" "a\\"b"'),
        ('{{ printf "%s-%d" .Values.s 7 }}', {"s": "x"}, "x-7"),
        ('{{ "abcdef-" | trunc 5 | trimSuffix "-" }}', {}, "abcde"),
        ('{{ "abcd-" | trunc 5 | trimSuffix "-" }}', {}, "abcd"),
        ('{{ join "," .Values.l }}', {"l": ["named", "single"]}, "named,single"),
        ("{{ and .Values.a .Values.a.b }}", {"a": None}, ""),  # lazy: .Values.a.b is never evaluated
        ('{{ or .Values.a "x" }}', {"a": ""}, "x"),
        ('{{ not (eq .Values.a "none") }}', {"a": "mixed"}, "true"),
        (
            '{{ kindIs "string" .Values.a }} {{ kindIs "bool" .Values.b }}',
            {"a": None, "b": False},
            "false true",
        ),
        ('{{ contains "volume-mounts" .Values.s }}', {"s": "envvar,volume-mounts"}, "true"),
        (
            '{{ hasKey .Values.m "default" }} {{ has "x" .Values.l }}',
            {"m": {"default": ""}, "l": ["x"]},
            "true true",
        ),
        ("{{ len .Values.m }}", {"m": {"a": 1, "b": 2}}, "2"),
        ("x:{{ toYaml .Values.m | nindent 2 }}", {"m": {"b": [1], "a": "s"}}, "x:\n  a: s\n  b:\n  - 1"),
        ("{{ toYaml .Values.s }}", {"s": "line1\nline2\n"}, "|\n  line1\n  line2"),
        ("{{ .Values.m | toJson }}", {"m": {"b": "<&>", "a": 1}}, '{"a":1,"b":"\\u003c\\u0026\\u003e"}'),
        ('{{ "a" | sha256sum | trunc 8 }}', {}, "ca978112"),
        ('{{ define "t1" }}[{{ .x }}]{{ end }}{{ include "t1" (dict "x" 5) }}', {}, "[5]"),
        (
            '{{ define "t2" }}{{ $.v }}{{ end }}{{ include "t2" .Values }}',
            {"v": "root-is-data"},
            "root-is-data",
        ),
    ],
)
def test_go_template_semantics(template: str, values: dict[str, Any], expected: str) -> None:
    assert run(template, values) == expected


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ('{{ template "x" . }}', "not supported"),
        ("{{ .Values.x | b64enc }}", "'b64enc' is not supported"),
        ("{{ .Values.a.b }}", "nil pointer evaluating .b"),
        ("{{ .Values.m }}", "refusing to print a dict"),
        ("{{ if .Values.a }}x", "if without end"),
        ("{{ end }}", "end without a block"),
        ('{{ fail "no way" }}', "no way"),
        ('{{ required "x is required" .Values.x }}', "x is required"),
        ("{{ $nope }}", "undefined variable $nope"),
        ('{{ eq true "true" }}', "incompatible types"),
        ('{{ eq 1 "1" }}', "incompatible types"),
    ],
)
def test_unsupported_or_wrong_templates_fail_loudly(template: str, message: str) -> None:
    with pytest.raises(helmlite.TemplateError, match=re.escape(message)):
        run(template, {"m": {"k": 1}})


def test_values_merge_like_helm() -> None:
    base = {"a": {"b": 1, "c": 2}, "l": [1, 2], "n": "x"}
    assert helmlite.coalesce(base, {"a": {"c": 3}, "l": [9], "n": None}) == {"a": {"b": 1, "c": 3}, "l": [9]}
    assert base == {"a": {"b": 1, "c": 2}, "l": [1, 2], "n": "x"}  # defaults untouched


def test_output_is_split_sorted_by_install_order_and_formatted_like_helm_template(tmp_path: Any) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("name: c\nversion: 1.0.0\nappVersion: '1'\n")
    (tmp_path / "values.yaml").write_text("x: 1\n")
    (tmp_path / "templates/a.yaml").write_text(
        "kind: DaemonSet\nmetadata: {name: d}\n---\n# only a comment\n---\n"
        "kind: ServiceAccount\nmetadata: {name: s}\n"
    )
    (tmp_path / "templates/_h.tpl").write_text('{{ define "x" }}ignored{{ end }}')
    chart = helmlite.load_chart(tmp_path)
    out = helmlite.render(chart, chart.values)
    assert [m.obj["kind"] for m in out] == ["ServiceAccount", "DaemonSet"]
    assert helmlite.format_manifests(out).startswith(
        "---\n# Source: c/templates/a.yaml\nkind: ServiceAccount\n"
    )

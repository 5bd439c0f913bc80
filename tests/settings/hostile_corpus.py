# ruff: noqa: E501  (a table of cases: one case per line reads best)
"""A corpus of malformed, hostile and borderline config files, each with the verdict NVIDIA's loading gives.

Built here, not stored: binary and non-UTF-8 bytes, replicas up to 10^30, alias bombs (under known and
unknown keys, through merges, recursive), files past the 1 MiB a ConfigMap holds, floods of unknown keys,
deep nesting, and values typed the way NVIDIA types them (api/config/v1 decoded by sigs.k8s.io/yaml:
go-yaml v2, then encoding/json). Used by the corpus tests (daemon and `config check` give the same verdict,
quickly, in bounded memory) and by bench/hostile_config_bench.py.
"""

from __future__ import annotations

import codecs
import random
from dataclasses import dataclass

ACCEPT, REFUSE = "accept", "refuse"
GPUS = 8  # the dgx-a100 profile the corpus runs against
FITS = 7960  # the most replicas per GPU whose device list fits the kubelet's 4 MiB message there

SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {}\n"
)
VALID = "version: v1\nflags:\n  migStrategy: none\n  plugin:\n    passDeviceSpecs: true\n"


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    verdict: str
    says: str = ""  # a text the error (refused) or a warning (accepted) contains


def _text(name: str, text: str, verdict: str, says: str = "") -> Case:
    return Case(name, text.encode(), verdict, says)


def laughs(width: int, depth: int, where: str) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, depth):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    body = "\n".join(f"  {line}" for line in lines)
    last = f"*l{depth - 1}"
    if where == "unknown":
        return f"bomb:\n{body}\nbig: {last}\n"
    if where == "flags":
        return f"bombs:\n{body}\nflags:\n  plugin:\n    deviceListStrategy: {last}\n"
    return f"bombs:\n{body}\nsharing:\n  timeSlicing:\n    resources: {last}\n"


def _binary() -> list[Case]:
    rng = random.Random(11)
    cases = []
    for i in range(30):
        data = bytes(rng.randrange(256) for _ in range(64 + 37 * i))
        cases.append(Case(f"random-bytes-{i}", data, REFUSE, "UTF-8"))
    bad = {
        "latin1-comment": b"version: v1\n# caf\xe9\n",
        "latin1-value": b"flags:\n  nvidiaDriverRoot: /caf\xe9\n",
        "lone-continuation": b"version: v1\n\x80\n",
        "truncated-sequence": b"version: v1\nflags: {}\n\xe2\x82",
        "overlong-slash": b"version: v1\nflags:\n  mpsRoot: \xc0\xaf\n",
        "encoded-surrogate": b"version: v1\n# \xed\xa0\x80\n",
        "byte-ff": b"\xff\xff\xfd",
        "windows-1252-quotes": b"flags:\n  migStrategy: \x93none\x94\n",
        "gzip-header": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",
    }
    cases += [Case(name, data, REFUSE, "UTF-8") for name, data in bad.items()]
    control = {
        "nul-in-key": b"a\x00b: 1\n",
        "nul-in-value": b"version: v1\x00\n",
        "escape-character": b"flags:\n  migStrategy: \x1bnone\n",
        "bell": b"version: v1\n\x07\n",
        "delete-character": b"version: v1\n# \x7f\n",
        "form-feed-in-value": b"flags:\n  migStrategy: no\x0cne\n",
        "utf16-without-bom": "version: v1\n".encode("utf-16-le"),  # valid UTF-8, full of NULs
    }
    cases += [
        Case(name, data, REFUSE, "control characters are not allowed") for name, data in control.items()
    ]
    # Encodings YAML allows, marked by a byte-order mark: NVIDIA's go-yaml reads them.
    cases += [
        Case("utf8-bom", codecs.BOM_UTF8 + VALID.encode(), ACCEPT),
        Case("utf16le-bom", codecs.BOM_UTF16_LE + VALID.encode("utf-16-le"), ACCEPT),
        Case("utf16be-bom", codecs.BOM_UTF16_BE + VALID.encode("utf-16-be"), ACCEPT),
    ]
    return cases


def _replicas() -> list[Case]:
    cases = [_text(f"replicas-{n}", SHARED.format(n), ACCEPT) for n in (2, 3, 8, 100, 1000, 4000, FITS)]
    too_many = (FITS + 1, 8000, 10_000, 65_536, 100_000, 1_000_000, 10**7, 10**9, 10**12, 10**15, 10**18)
    cases += [_text(f"replicas-{n}", SHARED.format(n), REFUSE, "ListAndWatch message") for n in too_many]
    cases += [_text("replicas-int64-max", SHARED.format(2**63 - 1), REFUSE, "ListAndWatch message")]
    overflow = {"2**63": 2**63, "2**64": 2**64, "10**30": 10**30}
    cases += [
        _text(f"replicas-{name}", SHARED.format(value), REFUSE, "json: cannot unmarshal number")
        for name, value in overflow.items()
    ]
    cases += [
        _text(f"replicas-{n}", SHARED.format(n), REFUSE, "number of replicas must be >= 2")
        for n in (1, 0, -1)
    ]
    devices = SHARED.format(4) + "      devices: {}\n"
    cases += [
        _text("devices-count-1000000", devices.format(1_000_000), ACCEPT),  # as many as there are: 8
        _text("devices-list-5000", devices.format([0] * 5000), ACCEPT),
        _text("devices-list-30000", devices.format([0] * 30000), REFUSE, "YAML nodes"),
    ]
    return cases


def _aliases() -> list[Case]:
    cases = []
    for width, depth in ((10, 9), (10, 6), (10, 5), (9, 9), (5, 12), (3, 20), (2, 40), (20, 4), (100, 3)):
        for where in ("unknown", "flags", "sharing"):
            cases.append(
                _text(f"laughs-{width}x{depth}-{where}", laughs(width, depth, where), REFUSE, "alias")
            )
    # Small, legitimate reuse: go-yaml allows it, so does kubegpu.
    cases += [
        _text("alias-reuse-resource", "r: &r {name: gpu, replicas: 4}\nsharing:\n  timeSlicing:\n    "
              "resources: [*r]\n", ACCEPT),
        _text("alias-reuse-flags", "x: &x none\nflags:\n  migStrategy: *x\n", ACCEPT),
        _text("laughs-2x3-unknown", laughs(2, 3, "unknown"), ACCEPT),
        _text("merge-reuse", "base: &b {migStrategy: none}\nflags:\n  <<: *b\n  failOnInitError: true\n", ACCEPT),
    ]  # fmt: skip
    recursive = {
        "self-sequence": "a: &a [*a]\n",
        "self-mapping": "a: &a {b: *a}\n",
        "self-flags": "flags: &f\n  plugin: *f\n",
        "self-merge": "a: &a {<<: *a}\n",
        "two-step": "a: &a [{b: &b [*a]}]\n",
        "deep-self": "a: &a {b: {c: {d: [*a]}}}\n",
        "self-in-sharing": "sharing: &s\n  timeSlicing:\n    resources: [*s]\n",
        "self-under-unknown": "x: &x [1, [2, [3, *x]]]\nversion: v1\n",
    }
    cases += [_text(f"recursive-{n}", t, REFUSE, "value contains itself") for n, t in recursive.items()]
    merges = "\n".join(
        ["m0: &m0 {k0: v}"] + [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 8)}]}}" for i in range(1, 9)]
    )
    cases += [
        _text("merge-bomb", merges + "\nflags: *m8\n", REFUSE, "alias"),
        _text("unknown-anchor", "flags: *nowhere\n", REFUSE, "unknown anchor 'nowhere' referenced"),
        _text("merge-of-scalar", "a: &a 1\nflags:\n  <<: *a\n", REFUSE, "map merge requires map"),
    ]  # fmt: skip
    return cases


def _sizes() -> list[Case]:
    mib = 1024 * 1024
    comment = b"# " + b"x" * 77 + b"\n"
    return [
        Case("10-MB-of-comments", comment * (10 * mib // len(comment)), REFUSE, "over the 1 MiB limit"),
        Case(
            "10-MB-of-keys", b"".join(b"k%07d: 1\n" % i for i in range(1_000_000)), REFUSE, "over the 1 MiB"
        ),
        Case("1-MiB-and-1-byte", b"#" * mib + b"\n", REFUSE, "over the 1 MiB limit"),
        Case("2-MiB-value", b"flags:\n  mpsRoot: " + b"a" * (2 * mib) + b"\n", REFUSE, "over the 1 MiB"),
        Case("1-MiB-of-comments", b"version: v1\n" + comment * ((mib - 20) // len(comment)), ACCEPT),
        Case("1-MiB-value", b"flags:\n  mpsRoot: /" + b"a" * (mib - 40) + b"\n", ACCEPT),
        Case("1-MiB-flow-list", b"x: [" + b"1," * (mib // 2 - 8) + b"1]\n", REFUSE, "YAML nodes"),
        Case("1-MiB-of-keys", b"".join(b"k%06d: 1\n" % i for i in range(mib // 11)), REFUSE, "YAML nodes"),
        Case("1-MiB-key", b"a" * (mib - 10) + b": 1\n", REFUSE, "yaml:"),  # a simple key is <= 1024 chars
        Case("1000-character-key", b"a" * 1000 + b": 1\n", ACCEPT, "unknown config key"),
        Case("empty", b"", ACCEPT),
        Case("only-whitespace", b"   \n\n\t\n", REFUSE, "yaml:"),
        Case("only-comments", b"# nothing\n", ACCEPT),
    ]


def _floods() -> list[Case]:
    cases = []
    for n in (30, 100, 1000, 5000, 9000):
        text = "version: v1\n" + "".join(f"unknownKey{i}: {i}\n" for i in range(n))
        cases.append(_text(f"unknown-keys-{n}", text, ACCEPT, "unknown config key"))
        flags = "flags:\n" + "".join(f"  misplacedFlag{i}: true\n" for i in range(n))
        cases.append(_text(f"unknown-flags-{n}", flags, ACCEPT, "more unknown config keys" if n > 20 else ""))
    for n in (10_001, 30_000):
        text = "".join(f"unknownKey{i}: {i}\n" for i in range(n))
        cases.append(_text(f"unknown-keys-{n}", text, REFUSE, "YAML nodes"))
    near = "".join(f"renameByDefault{i}: true\n" for i in range(2000))  # each asks for a did-you-mean
    cases.append(_text("did-you-mean-flood", near, ACCEPT, "more unknown config keys"))
    cases.append(_text("bomb-under-unknown-key", laughs(10, 7, "unknown"), REFUSE, "alias"))
    return cases


def _nesting() -> list[Case]:
    cases = []
    for depth in (10, 100, 500, 999):
        cases.append(_text(f"flow-nesting-{depth}", "x: " + "[" * depth + "]" * depth + "\n", ACCEPT))
        block = "".join(" " * i + f"k{i}:\n" for i in range(depth)) + " " * depth + "v\n"
        cases.append(_text(f"block-nesting-{depth}", block, ACCEPT))
    for depth in (1001, 5000, 100_000):
        cases.append(
            _text(f"flow-nesting-{depth}", "x: " + "[" * depth + "]" * depth + "\n", REFUSE, "nesting depth")
        )
    cases.append(
        _text("block-nesting-1001", "".join(" " * i + f"k{i}:\n" for i in range(1001)), REFUSE, "depth")
    )
    deep = "[" * 990 + "]" * 990  # in fields NVIDIA reads: each must be refused without deep recursion
    known = {
        "resources": f"sharing:\n  timeSlicing:\n    resources: {deep}\n",
        "devices": f"sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: {deep}\n",
        "sleepInterval": f"flags:\n  gfd:\n    sleepInterval: {deep}\n",
        "channelIDs": f"imex:\n  channelIDs: {deep}\n",
        "deviceListStrategy": f"flags:\n  plugin:\n    deviceListStrategy: {deep}\n",
        "flags": f"flags: {deep}\n",
        "version": f"version: {deep}\n",
        "gpus": f"resources:\n  gpus: {deep}\n",
    }
    cases += [_text(f"deep-nesting-in-{name}", text, REFUSE) for name, text in known.items()]
    cases.append(_text("nan-deep-inside", "x: " + "[" * 995 + ".nan" + "]" * 995 + "\n", REFUSE, "NaN"))
    return cases


# (value, verdict, error text) for one field, as NVIDIA's decoding gives it.
REPLICAS = [
    ("'4'", REFUSE, "json: cannot unmarshal string into Go struct field Sharing.sharing.timeSlicing of type int"),
    ('"4"', REFUSE, "json: cannot unmarshal string into Go struct field Sharing.sharing.timeSlicing of type int"),
    ("4.5", REFUSE, "json: cannot unmarshal number 4.5 into Go struct field Sharing.sharing.timeSlicing of type int"),
    ("1e21", REFUSE, "json: cannot unmarshal number 1e+21 into Go struct field Sharing.sharing.timeSlicing of type int"),
    ("true", REFUSE, "json: cannot unmarshal bool into Go struct field Sharing.sharing.timeSlicing of type int"),
    ("[4]", REFUSE, "json: cannot unmarshal array into Go struct field Sharing.sharing.timeSlicing of type int"),
    ("{a: 4}", REFUSE, "json: cannot unmarshal object into Go struct field Sharing.sharing.timeSlicing of type int"),
    ("null", REFUSE, "number of replicas must be >= 2"),
    ("'0x10'", REFUSE, "json: cannot unmarshal string"),
    ("4.0", ACCEPT, ""),
    ("0x10", ACCEPT, ""),
    ("1_000", ACCEPT, ""),
    ("010", ACCEPT, ""),
    ("0o10", ACCEPT, ""),
    ("+4", ACCEPT, ""),
    ("1e3", ACCEPT, ""),
    ("0b101", ACCEPT, ""),
    ("08", ACCEPT, ""),
]  # fmt: skip
BOOLS = [
    ("yes", ACCEPT, ""),
    ("y", ACCEPT, ""),
    ("on", ACCEPT, ""),
    ("TRUE", ACCEPT, ""),
    ("'yes'", REFUSE, "json: cannot unmarshal string into Go struct field Flags.flags.CommandLineFlags."),
    ('"true"', REFUSE, "json: cannot unmarshal string into Go struct field Flags.flags.CommandLineFlags."),
    ("1", REFUSE, "json: cannot unmarshal number into Go struct field Flags.flags.CommandLineFlags."),
    ("maybe", REFUSE, "json: cannot unmarshal string into Go struct field Flags.flags.CommandLineFlags."),
]
OTHERS = [
    ("flags:\n  plugin:\n    passDeviceSpecs: 'true'\n", REFUSE,
     "json: cannot unmarshal string into Go struct field PluginCommandLineFlags.flags.CommandLineFlags.plugin."
     "passDeviceSpecs of type bool"),
    ("flags:\n  plugin:\n    deviceListStrategy: 5\n", REFUSE, "invalid deviceListStrategy: 5"),
    ("flags:\n  plugin:\n    deviceListStrategy: [envvar, 1]\n", REFUSE, 'invalid deviceListStrategy: ["envvar",1]'),
    ("flags:\n  migStrategy: 1\n", REFUSE, "unknown MIG strategy: 1"),
    ("flags:\n  MIGStrategy: none\n", ACCEPT, "is read as flags.migStrategy"),
    ("flags:\n  gfd:\n    sleepInterval: -5s\n", REFUSE, "is not positive"),
    ("flags:\n  gfd:\n    sleepInterval: -1\n", REFUSE, "is not positive"),
    ("flags:\n  gfd:\n    sleepInterval: 0\n", REFUSE, "is not positive"),
    ("flags:\n  gfd:\n    sleepInterval: '10'\n", REFUSE, 'time: missing unit in duration "10"'),
    ("flags:\n  gfd:\n    sleepInterval: 10\n", ACCEPT, ""),
    ("flags:\n  gfd:\n    sleepInterval: 2m\n", ACCEPT, ""),
    ("flags:\n  gfd:\n    sleepInterval: .inf\n", REFUSE, "json: unsupported value: +Inf"),
    ("flags:\n  gfd:\n    sleepInterval: true\n", REFUSE, "invalid duration"),
    ("imex:\n  channelIDs: ['0']\n", REFUSE,
     "json: cannot unmarshal string into Go struct field Imex.imex.channelIDs of type int"),
    ("imex:\n  channelIDs: [0]\n", ACCEPT, ""),
    ("imex:\n  channelIDs: [1]\n", REFUSE, "channelIDs must be [] or [0]; found [1]"),
    ("version: v2\n", REFUSE, "unknown version: v2"),
    ("version: 1\n", REFUSE, "unknown version: 1"),
    ("version: ''\n", ACCEPT, ""),
    ("- a\n- b\n", REFUSE, "json: cannot unmarshal array into Go value of type v1.Config"),
    ("just a string\n", REFUSE, "json: cannot unmarshal string into Go value of type v1.Config"),
    ("42\n", REFUSE, "json: cannot unmarshal number into Go value of type v1.Config"),
    ("version: v1\n---\nversion: v2\n", ACCEPT, ""),  # go-yaml's Unmarshal reads the first document only
    ("---\n", ACCEPT, ""),
    ('{"version": "v1", "flags": {"migStrategy": "none"}}\n', ACCEPT, ""),
    ('{"version": "v1",\n', REFUSE, "yaml:"),
    ("flags:\n\tmigStrategy: none\n", REFUSE, "yaml: line"),
    ("flags: [\n", REFUSE, "yaml: line 1: did not find expected node content"),
    ("flags:\n  migStrategy: 'none\n", REFUSE, "yaml:"),
    ("flags:\n  migStrategy: none\n  migStrategy: single\n", ACCEPT, ""),
    ("~: 1\n", REFUSE, "a mapping key is null"),
    ("? [a, b]\n: c\n", REFUSE, "invalid map key"),
    ("flags:\n  migStrategy: !!binary bm9uZQ==\n", ACCEPT, ""),
    ("flags:\n  migStrategy: !!binary '*'\n", REFUSE, "!!binary value contains invalid base64 data"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: !!int four\n", REFUSE,
     "cannot decode !!str `four` as a !!int"),
    ("extra: !custom value\n", ACCEPT, "unknown config key extra"),
    ("when: 2024-01-01\n", ACCEPT, ""),
    ("x: .nan\n", REFUSE, "json: unsupported value: NaN"),
    ("flags:\n  nvidiaDriverRoot: .nan\n", ACCEPT, ""),  # a string field: sigs.k8s.io/yaml writes "NaN"
    ("sharing:\n  timeSlicing: null\n", REFUSE, "no resources specified"),
    ("sharing:\n  timeSlicing:\n    resources: {}\n", REFUSE,
     "cannot unmarshal object into Go struct field Sharing.sharing.timeSlicing of type []v1.ReplicatedResource"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: 123\n      replicas: 2\n", REFUSE,
     "json: cannot unmarshal number into Go struct field Sharing.sharing.timeSlicing of type string"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: ''\n      replicas: 2\n", REFUSE,
     "incorrect format for resource name 'nvidia.com/'"),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: 2.0\n", ACCEPT, ""),
    ("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: [-1]\n", REFUSE,
     "unsupported type for device in devices list: , string"),
    ("resources:\n  gpus:\n  - pattern: 1\n    name: gpu\n", REFUSE,
     "json: cannot unmarshal number into Go struct field Resources.resources.gpus of type v1.ResourcePattern"),
]  # fmt: skip


def _typed() -> list[Case]:
    cases = [
        _text(f"replicas-as-{value}", SHARED.format(value), verdict, says)
        for value, verdict, says in REPLICAS
    ]
    for field in ("failOnInitError", "gdsEnabled"):
        cases += [
            _text(f"{field}-as-{value}", f"flags:\n  {field}: {value}\n", verdict, says)
            for value, verdict, says in BOOLS
        ]
    cases += [_text(f"other-{i}", text, verdict, says) for i, (text, verdict, says) in enumerate(OTHERS)]
    return cases


def corpus() -> list[Case]:
    cases = [*_binary(), *_replicas(), *_aliases(), *_sizes(), *_floods(), *_nesting(), *_typed()]
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    return cases


def worst_cases() -> list[Case]:
    """The costliest to refuse (what the benchmark times): the largest inputs that are read in full."""
    names = {"1-MiB-flow-list", "1-MiB-of-keys", "laughs-10x9-sharing", "flow-nesting-100000", "merge-bomb"}
    return [c for c in corpus() if c.name in names]

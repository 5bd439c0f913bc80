"""`lint`'s whole output on a large generated file is what it was before lint was made fast.

The digests below are of the output of the code before the documents were streamed and built by a fast
path (commit c31ac3c's parent), on the corpus of `lint_corpus.py`: every finding, its line, document,
path, message and fix, in order, as text and as JSON. A speed-up that moves one line number or drops one
finding changes them. The counts per rule say what the corpus exercises.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.toolkit.lint_corpus import corpus_json, corpus_yaml

CASES = {
    "yaml": (
        lambda: corpus_yaml(3000),
        "ad28cc2fefbe8442783bb6e9a5c9009a4ed689541a0d67ead887d25a23a4880d",  # --json
        "0183cf1913904c6891e74f799e7dae06f787bcdcbba26801667e7f5f373d58dc",  # text
        {"KG000": 27, "KG001": 1198, "KG002": 480, "KG003": 1408, "KG004": 685, "KG005": 210, "KG006": 1149,
         "KG007": 139, "KG008": 488, "KG009": 713, "KG014": 130, "KG015": 677, "KG016": 543, "KG017": 6,
         "KG019": 6, "KG021": 136},
    ),
    "json": (
        lambda: corpus_json(1500),
        "45206bc7c054cf8890906b51e52d31a4941ccbd32524740714a803900d8cb811",
        "f1c50311789410f21665f1f392b14a35bee77ca817522e88ef79cf4f6e994d17",
        {"KG001": 585, "KG002": 288, "KG003": 758, "KG004": 360, "KG005": 107, "KG006": 571, "KG007": 76,
         "KG008": 271, "KG009": 370, "KG014": 62, "KG015": 357, "KG016": 278},
    ),
}  # fmt: skip


def lint(cwd: Path, *args: str) -> bytes:
    proc = subprocess.run([sys.executable, "-m", "kubegpu", "lint", *args], cwd=cwd, capture_output=True)
    assert proc.returncode == 1, proc.stderr  # errors among the findings
    return proc.stdout


@pytest.mark.parametrize("kind", list(CASES))
def test_the_whole_output_on_a_large_file_is_unchanged(tmp_path: Path, kind: str) -> None:
    make, json_digest, text_digest, per_rule = CASES[kind]
    name = f"corpus.{kind}"
    (tmp_path / name).write_text(make())
    as_json = lint(tmp_path, "--json", name)
    assert dict(Counter(f["rule"] for f in json.loads(as_json)["findings"])) == per_rule
    assert hashlib.sha256(as_json).hexdigest() == json_digest
    assert hashlib.sha256(lint(tmp_path, name)).hexdigest() == text_digest

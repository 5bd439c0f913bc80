"""Reading a user's file: bounded, decoded, and every problem one line naming the file, where, and the fix."""

from __future__ import annotations

import codecs
import os
from pathlib import Path

import pytest

from kubegpu.common.files import FileProblem, read_bytes, read_text_file


def problem(path: Path | str, limit: int = 100) -> str:
    with pytest.raises(FileProblem) as err:
        read_text_file(path, limit=limit, what="config file")
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_directory_and_fifo(tmp_path: Path) -> None:
    assert problem(tmp_path / "nope") == (
        f"{tmp_path / 'nope'}: no such file or directory; check the path of the config file"
    )
    assert problem(tmp_path) == f"{tmp_path}: is a directory; name the config file itself, not its directory"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it must not wait for a writer
    assert problem(fifo) == f"{fifo}: is not a regular file; name a regular file as the config file"


def test_size_limit_without_reading_the_file(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    assert problem(big) == (
        f"{big}: is 101 bytes, over the 100 bytes limit for a config file; check that it is the right file "
        "(the limit is 100 bytes)"
    )
    (tmp_path / "exact").write_bytes(b"x" * 100)
    assert read_text_file(tmp_path / "exact", limit=100) == "x" * 100


def test_a_device_is_refused_at_once_but_dev_null() -> None:
    # /dev/zero was read to the limit (2 GiB for a snapshot) before it was refused.
    assert problem("/dev/zero") == (
        "/dev/zero: is not a regular file; name a regular file as the config file"
    )
    assert read_bytes("/dev/null", limit=100) == b""  # config-manager's empty config is a /dev/null link


def test_procfs_files_report_size_0_and_are_read_whole() -> None:
    assert "MemTotal:" in read_text_file("/proc/meminfo", limit=1 << 20)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"version: v1\n# caf\xe9\n", "byte 0xe9 at offset 17 (line 2, column 6)"),
        (b"\x80", "byte 0x80 at offset 0 (line 1, column 1)"),
        (b"ab\ncd\nef\xc3", "byte 0xc3 at offset 8 (line 3, column 3)"),
    ],
)
def test_bytes_that_are_not_utf8_are_named_with_their_place(tmp_path: Path, data: bytes, where: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    assert problem(path) == (
        f"{path}: is not UTF-8 text: {where} is not valid UTF-8; save the config file as UTF-8 text "
        "(e.g. iconv -f latin1 -t utf-8)"
    )


@pytest.mark.parametrize(
    ("bom", "codec"),
    [(codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
     (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be")],
)  # fmt: skip
def test_byte_order_marks_name_the_encoding_yaml_allows(tmp_path: Path, bom: bytes, codec: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(bom + "version: v1\n# café\n".encode(codec))
    assert read_text_file(path, limit=1000) == "version: v1\n# café\n"

"""Files as kubegpu reads and writes them.

Reading: every file a user hands us (config files, profiles, catalogs, snapshots) is read as bytes, at most
a size limit, and decoded with an error that names the file, the position and the fix; never a traceback,
never a read that runs until memory is gone (`/dev/zero`, a FIFO, a 10 GB log passed by mistake).
Writing: a file is replaced so that readers see the old content or the new, never a mix or nothing.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from kubegpu.common.quoting import VALUE_LIMIT, plain_id

MIB = 1024 * 1024

# UTF-16 and UTF-32 byte-order marks, longest first (the UTF-32 LE mark starts with the UTF-16 LE one).
# YAML allows these encodings (YAML 1.1 section 5.2; libyaml and go-yaml detect them), so a config saved
# as UTF-16 by a Windows editor is read as NVIDIA reads it.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


class FileProblem(ValueError):
    """A file we cannot use. `str()` is one line: the file, what is wrong (where), and the fix."""

    def __init__(self, path: str | os.PathLike[str], problem: str, fix: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        # A path holding a newline would end the one-line error there: quoted, as device IDs are.
        super().__init__(f"{plain_id(self.path, VALUE_LIMIT)}: {problem}; {fix}")


def describe_size(size: int) -> str:
    """1048576 -> "1 MiB", 1536 -> "1.5 KiB", 10 -> "10 bytes"."""
    for unit, scale in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def read_bytes(path: str | os.PathLike[str], *, limit: int, what: str = "file") -> bytes:
    """At most `limit` bytes of `path`; FileProblem when it is missing, unreadable, not a file or larger.

    Only regular files are read (their size checked before a byte is), and `/dev/null` (config-manager
    links an empty config to it); any other device (`/dev/zero`), FIFO or socket is refused at once rather
    than read to the limit or waited on. `what` names the file in the fix ("config file", "snapshot").
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise FileProblem(path, (err.strerror or str(err)).lower(), f"check the path of the {what}") from err
    try:
        return _read_fd(fd, path, limit=limit, what=what, stream=False)
    finally:
        os.close(fd)


def read_stream_bytes(stream: BinaryIO, name: str, *, limit: int, what: str = "file") -> bytes:
    """At most `limit` bytes of an open stream (standard input), with `read_bytes`'s checks and texts: a
    redirected file is size-checked first, a device other than /dev/null refused, a pipe read up to the
    limit."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation: an in-memory stream (tests, embedding)
        data = stream.read(limit + 1)
        if len(data) > limit:
            raise _too_large(name, None, limit, what) from None
        return data
    return _read_fd(fd, name, limit=limit, what=what, stream=True)


def read_input(name: str, *, limit: int, what: str = "file") -> tuple[str, bytes]:
    """A command's input: `name`, or standard input for "-"; returns how errors name it, and its bytes."""
    if name == "-":
        return "<stdin>", read_stream_bytes(sys.stdin.buffer, "<stdin>", limit=limit, what=what)
    return name, read_bytes(name, limit=limit, what=what)


def _read_fd(fd: int, path: str | os.PathLike[str], *, limit: int, what: str, stream: bool) -> bytes:
    """`stream`: standard input, which may also be a pipe or a terminal (read up to the limit)."""
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileProblem(path, "is a directory", f"name the {what} itself, not its directory")
        piped = stream and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or os.isatty(fd))
        if not (stat.S_ISREG(st.st_mode) or _is_dev_null(st) or piped):
            raise FileProblem(path, "is not a regular file", f"name a regular file as the {what}")
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise _too_large(path, st.st_size, limit, what)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(limit + 1 - total, MIB))
            except BlockingIOError:  # a pipe with nothing yet: wait for the writer
                select.select([fd], [], [])
                continue
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as err:
        raise FileProblem(path, (err.strerror or str(err)).lower(), f"check the {what}") from err
    if total > limit:  # a file that grew while we read it, or a pipe that never ends
        raise _too_large(path, None, limit, what)
    return b"".join(chunks)


def _is_dev_null(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def _too_large(path: str | os.PathLike[str], size: int | None, limit: int, what: str) -> FileProblem:
    found = f"is {describe_size(size)}" if size is not None else "does not end"
    return FileProblem(
        path,
        f"{found}, over the {describe_size(limit)} limit for a {what}",
        f"check that it is the right file (the limit is {limit} bytes)",
    )


def decode_text(data: bytes, path: str | os.PathLike[str], *, what: str = "file") -> str:
    """UTF-8 text (a UTF-8, UTF-16 or UTF-32 byte-order mark is honoured and removed).

    Bytes that are not UTF-8 raise FileProblem naming the byte, its offset, line and column.
    """
    encoding, skip = "utf-8", 0
    for bom, name in _BOMS:
        if data.startswith(bom):
            encoding, skip = name, len(bom)
            break
    try:
        return data[skip:].decode(encoding)
    except UnicodeDecodeError as err:
        offset = skip + err.start  # in the file, BOM included
        line = data.count(b"\n", 0, offset) + 1
        column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
        byte = data[offset : offset + 1].hex()
        raise FileProblem(
            path,
            f"is not {encoding.upper()} text: byte 0x{byte} at offset {offset} "
            f"(line {line}, column {column}) is not valid {encoding.upper()}",
            f"save the {what} as UTF-8 text (e.g. iconv -f latin1 -t utf-8)",
        ) from None


def read_text_file(path: str | os.PathLike[str], *, limit: int, what: str = "file") -> str:
    """The text of `path`, read as bytes (at most `limit`) and decoded as UTF-8. Raises FileProblem."""
    return decode_text(read_bytes(path, limit=limit, what=what), path, what=what)


def write_atomic(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    tmp_dir: Path | None = None,
    skip_unchanged: bool = False,
    durable: bool = True,
) -> bool:
    """Write `data` to a temporary file and rename it over `path`. Returns False when skipped as unchanged.

    `mode` is set explicitly (mkstemp creates 0600, and the umask must not decide what others may read).
    `tmp_dir` must be on the same file system as `path` (rename is atomic only there); it defaults to
    `path`'s directory. `durable` fsyncs before the rename, so a crash cannot leave an empty file behind.
    The modification time is set from a precise clock, so readers may cache on (inode, mtime).
    """
    if skip_unchanged:
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                return False
    directory = tmp_dir or path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            _write_fully(fd, data)
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        now = time.time_ns()
        os.utime(tmp, ns=(now, now))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

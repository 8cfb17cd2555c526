"""Per-file limits, checked in Python while a landing file is probed, before Spark sees it.

A file over a limit is quarantined with the limit named, so that Spark never meets the input that
makes it fail for the whole batch or hang: Jackson's 20,000,000-character string ceiling, a
StackOverflowError while inferring a schema hundreds of levels deep, a single line of gigabytes.
The values come from the source's `limits` metadata (`lakehouse.metadata.model.FileLimits`).
"""

from __future__ import annotations

import io

#: Spark 3.5's JSON parser (Jackson StreamReadConstraints) refuses longer strings, whatever the limits say.
SPARK_JSON_MAX_STRING = 20_000_000

#: Leading bytes of compressed data: Spark picks a codec from the file name only.
COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
}
#: File name endings Spark decompresses by itself.
CODEC_SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".zst": "zstd", ".deflate": "deflate", ".lz4": "lz4",
                  ".snappy": "snappy"}


class LimitExceeded(ValueError):
    """A file goes over one of its source's limits: the message names the limit and the value."""

    def __init__(self, limit: str, allowed: int, found: int | str, where: str = ""):
        self.limit, self.allowed, self.found = limit, allowed, found
        at = f"{where}: " if where else ""
        super().__init__(f"{at}{found} exceeds the limit {limit}={allowed}")


def compression_of(head: bytes) -> str | None:
    """The compression format `head` (a file's first bytes) starts with, if any."""
    return next((name for magic, name in COMPRESSED_MAGIC.items() if head.startswith(magic)), None)


class BoundedLines(io.RawIOBase):
    """A raw stream over `fh` that raises LimitExceeded as soon as a line passes `max_line_bytes`,
    so reading a file of one endless line never holds more than the limit in memory."""

    def __init__(self, fh, max_line_bytes: int):
        self.fh = fh
        self.max = max_line_bytes
        self.current = 0  # bytes since the last newline
        self.line = 1

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self.fh.read(min(len(buf), 1 << 20))
        if not data:
            return 0
        first = data.find(b"\n")
        if first < 0:
            self.current += len(data)
        else:
            self._check(self.current + first)
            if self.max < len(data):  # a whole line inside this chunk may be too long too
                start = first + 1
                while (nxt := data.find(b"\n", start)) >= 0:
                    self._check(nxt - start)
                    start = nxt + 1
            self.line += data.count(b"\n")
            self.current = len(data) - data.rfind(b"\n") - 1
        self._check(self.current)
        n = len(data)
        buf[:n] = data
        return n

    def _check(self, length: int) -> None:
        if length > self.max:
            raise LimitExceeded("max_line_bytes", self.max, f"a line of {length}+ bytes (near line {self.line})")


def arrow_shape(schema) -> tuple[int, int]:
    """(nesting depth, number of fields including nested ones) of a pyarrow schema."""
    import pyarrow as pa

    def walk(t, depth: int) -> tuple[int, int]:
        if pa.types.is_struct(t):
            children = [t.field(i).type for i in range(t.num_fields)]
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            children = [t.value_type]
        elif pa.types.is_map(t):
            children = [t.key_type, t.item_type]
        else:
            return depth, 0
        deepest, count = depth + 1, len(children) if pa.types.is_struct(t) else 0
        for c in children:
            d, n = walk(c, depth + 1)
            deepest, count = max(deepest, d), count + n
        return deepest, count

    depth, count = 1, len(schema)
    for f in schema:
        d, n = walk(f.type, 1)
        depth, count = max(depth, d), count + n
    return depth, count

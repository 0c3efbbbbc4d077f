"""Reading a stream a line at a time with a bound on the memory one line may take.

A plain ``for line in file`` holds each line whole: one 200 MB line of a JSON Lines file costs
200 MB (and a parser's copies of it several times more). :func:`bounded_lines` reads at most
``max_bytes + 1`` bytes of a line; a longer line is skipped to its end in pieces of
:data:`SKIP_CHUNK_BYTES` and comes back as an :class:`OversizedLine` with its size, so that a
reader can reject that row and go on with the next one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

SKIP_CHUNK_BYTES = 1 << 20  # the most read at once while skipping the rest of an oversized line


class LineReadable(Protocol):
    """A binary stream with ``readline(limit)`` (an open file, ``io.BufferedReader``)."""

    def readline(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class OversizedLine:
    """A line longer than the bound: its size in bytes (without the line end), not its content."""

    size: int


def bounded_lines(stream: LineReadable, max_bytes: int) -> Iterator[bytes | OversizedLine]:
    """Each line of ``stream`` (with its line end), or an :class:`OversizedLine` for a line of more
    than ``max_bytes`` bytes (line end not counted). Memory stays within ``max_bytes`` plus one
    skip chunk, however long a line is."""
    while line := stream.readline(max_bytes + 1):
        if line.endswith(b"\n") or len(line) <= max_bytes:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = stream.readline(SKIP_CHUNK_BYTES)
            if not line:
                break
            size += len(line)
        yield OversizedLine(size - len(_line_end(line)))


def _line_end(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return b"\r\n"
    return b"\n" if line.endswith(b"\n") else b""


def describe_size(size: int) -> str:
    """A byte count for messages: '209,715,200 bytes (200.0 MiB)', '5,033 bytes (4.9 KiB)', '200 bytes'."""
    if size >= 2**20:
        return f"{size:,} bytes ({size / 2**20:.1f} MiB)"
    return f"{size:,} bytes ({size / 2**10:.1f} KiB)" if size >= 2**10 else f"{size:,} bytes"

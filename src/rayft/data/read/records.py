"""Cutting a CSV file into records, and a JSON array (alone, or the one list of rows in a JSON object)
into its items, with a bound on the memory one record may take (what
:func:`rayft.lines.bounded_lines` does for JSON Lines).

A parser given a whole file holds a 200 MB cell whole, and its copies of it; these read the file in
pieces of :data:`CHUNK_BYTES`, keep at most ``max_bytes`` of a record, and give a longer one back
as an :class:`~rayft.lines.OversizedLine` with its size, so that the reader rejects that row
(``row_too_large``) and goes on with the next. Only the structure is read here (quotes, brackets,
the separators); the records themselves are parsed by pyarrow's CSV reader and ``json.loads``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Protocol

from rayft.lines import OversizedLine

CHUNK_BYTES = 1 << 20
_JSON_STRUCTURE = re.compile(rb'["\[\]{},]')
_JSON_STRING = re.compile(rb'["\\]')
_JSON_OBJECT_STRUCTURE = re.compile(rb'["\[\]{},:]')
_KEY_BYTES = 200  # of a key, kept to name it


class Readable(Protocol):
    """A binary stream with ``read(size)`` (an open file)."""

    def read(self, size: int = -1, /) -> bytes: ...


class _Record:
    """The record being read: its bytes while they fit the bound, its size always."""

    def __init__(self, max_bytes: int, *, lstrip: bool = False) -> None:
        self.max_bytes = max_bytes
        self.lstrip = lstrip  # whitespace before the record is not part of it (between JSON items)
        self.data = bytearray()
        self.size = 0

    def take(self, piece: bytes) -> None:
        if self.lstrip and self.size == 0:
            piece = piece.lstrip()
        self.size += len(piece)
        if self.size <= self.max_bytes:
            self.data += piece
        elif self.data:
            self.data = bytearray()  # over the bound: only its size is kept from here on

    def end(self, ending: int = 0) -> bytes | OversizedLine:
        """The record, or its size (less the ``ending`` bytes that close it) when over the bound;
        and a fresh start."""
        size, data = self.size, bytes(self.data)
        self.data, self.size = bytearray(), 0
        return OversizedLine(size - ending) if size > self.max_bytes else data


def csv_records(stream: Readable, max_bytes: int) -> Iterator[bytes | OversizedLine]:
    """Each record of a CSV stream, its line end included (a quoted field may hold line ends and
    doubled quotes), or an :class:`OversizedLine` for one of more than ``max_bytes`` bytes."""
    record, quoted = _Record(max_bytes + 2), False  # room for the line end
    while chunk := stream.read(CHUNK_BYTES):
        pos = 0
        while pos < len(chunk):
            quote = chunk.find(b'"', pos)
            if quoted:  # a doubled quote ends the quoting and starts it again: the same
                end = len(chunk) if quote < 0 else quote + 1
                record.take(chunk[pos:end])
                pos, quoted = end, quote < 0
                continue
            newline = chunk.find(b"\n", pos)
            if newline >= 0 and (quote < 0 or newline < quote):
                record.take(chunk[pos : newline + 1])
                ending = 2 if chunk[newline - 1 : newline] == b"\r" else 1
                pos = newline + 1
                yield record.end(ending)
            elif quote >= 0:
                record.take(chunk[pos : quote + 1])
                pos, quoted = quote + 1, True
            else:
                record.take(chunk[pos:])
                pos = len(chunk)
    if record.size:
        yield record.end()


def json_array_items(stream: Readable, max_bytes: int) -> Iterator[bytes | OversizedLine]:
    """Each item of the JSON array that ``stream`` holds (after any leading whitespace and ``[``),
    as its JSON text, or an :class:`OversizedLine` for one of more than ``max_bytes`` bytes. An
    array left open yields what it holds of its last item (which then does not parse)."""
    scanner = _ArrayScanner(max_bytes)
    for chunk in _chunks(stream, lambda: scanner.closed):
        yield from scanner.feed(chunk)
    if not scanner.closed:
        yield from scanner.last()


def json_object_lists(stream: Readable) -> list[str] | None:
    """The keys of the lists directly in the JSON object that ``stream`` holds (read once, in pieces,
    holding no value); None where the stream holds more than that object (JSON Lines under a
    ``.json`` name: only whitespace may follow it), or an object left open."""
    scanner, rest = _ObjectScanner(None), b""
    for chunk in _chunks(stream, lambda: scanner.closed):
        for _ in scanner.feed(chunk):
            pass
        rest = chunk[scanner.end :]
    while scanner.closed and not rest.strip() and (more := stream.read(CHUNK_BYTES)):
        rest = more
    return scanner.lists if scanner.closed and not rest.strip() else None


def json_object_items(stream: Readable, max_bytes: int) -> Iterator[bytes | OversizedLine]:
    """Each item of the first list directly in the JSON object that ``stream`` holds (``{"data":
    [...]}``), as :func:`json_array_items` gives them; the object's other values are skipped unread."""
    scanner = _ObjectScanner(max_bytes)
    for chunk in _chunks(stream, lambda: scanner.closed):
        yield from scanner.feed(chunk)
    if scanner.items is not None and not scanner.items.closed:
        yield from scanner.items.last()


def _chunks(stream: Readable, done: Callable[[], bool]) -> Iterator[bytes]:
    """``stream`` in pieces of :data:`CHUNK_BYTES` until it ends or ``done()``; an escape's
    backslash comes with the character it escapes."""
    while not done() and (chunk := stream.read(CHUNK_BYTES)):
        if chunk.endswith(b"\\"):
            chunk += stream.read(1)
        yield chunk


class _ArrayScanner:
    """The state of a scan of a JSON array: the item being read, the nesting depth (1 directly inside
    the array), and whether the scan is in a string."""

    def __init__(self, max_bytes: int) -> None:
        self.record = _Record(max_bytes, lstrip=True)
        self.depth = 0
        self.in_string = False
        self.closed = False
        self.end = 0  # where in the last piece the array closed

    def feed(self, chunk: bytes) -> Iterator[bytes | OversizedLine]:
        """The items that end in ``chunk``."""
        pos = 0
        if self.depth == 0:
            start = chunk.find(b"[")
            if start < 0:
                return
            pos, self.depth = start + 1, 1
        while pos < len(chunk) and not self.closed:
            if self.in_string:
                pos = self._string(chunk, pos)
                continue
            found = _JSON_STRUCTURE.search(chunk, pos)
            if found is None:
                self.record.take(chunk[pos:])
                return
            mark, end = found.group(), found.end()
            if self.depth == 1 and mark in (b",", b"]"):
                self.record.take(chunk[pos : found.start()])
                self.closed, self.end = mark == b"]", end
                yield from self.last()
            else:
                self.record.take(chunk[pos:end])
                self.in_string = mark == b'"'
                self.depth += {b"[": 1, b"{": 1, b"]": -1, b"}": -1}.get(mark, 0)
            pos = end

    def _string(self, chunk: bytes, pos: int) -> int:
        """Read on in a string from ``pos``; return where the scan goes on."""
        found = _JSON_STRING.search(chunk, pos)
        if found is None:
            self.record.take(chunk[pos:])
            return len(chunk)
        end = found.end() + 1 if found.group() == b"\\" else found.end()  # an escape takes the next byte
        self.record.take(chunk[pos:end])
        self.in_string = found.group() == b"\\"
        return end

    def last(self) -> Iterator[bytes | OversizedLine]:
        """The item read so far, unless it is blank (``[]``, a trailing comma)."""
        item = self.record.end()
        if isinstance(item, OversizedLine):
            yield item
        elif item.strip():
            yield item.strip()


class _ObjectScanner:
    """The state of a scan of a JSON object: the nesting depth (1 directly in the object), whether
    the scan is in a string (and in a key, kept to :data:`_KEY_BYTES`), whether a value of the object
    comes next, the keys of its lists, and the scan of the list of rows while in it.

    With ``max_bytes`` None the scan only looks for the lists (:func:`json_object_lists`); else it
    gives the items of the first one (:func:`json_object_items`), each at most ``max_bytes`` held."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.depth = 0
        self.in_string = self.in_key = self.at_value = self.closed = False
        self.key = bytearray()
        self.lists: list[str] = []
        self.items: _ArrayScanner | None = None
        self.end = 0  # where in the last piece the object closed

    def feed(self, chunk: bytes) -> Iterator[bytes | OversizedLine]:
        """The items of the list of rows that end in ``chunk``."""
        pos = 0
        while pos < len(chunk) and not self.closed:
            if self.items is not None and not self.items.closed:
                piece = chunk[pos:] if pos else chunk
                yield from self.items.feed(piece)
                pos = pos + self.items.end if self.items.closed else len(chunk)
            elif self.in_string:
                pos = self._string(chunk, pos)
            else:
                pos = self._structure(chunk, pos)

    def _structure(self, chunk: bytes, pos: int) -> int:
        """Take the next quote, bracket, brace, comma or colon from ``pos``; return where the scan goes on."""
        found = _JSON_OBJECT_STRUCTURE.search(chunk, pos)
        if found is None:
            return len(chunk)
        mark, at_value = found.group(), self.at_value
        self.at_value = self.depth == 1 and mark == b":"
        if self.depth == 1 and at_value and mark == b"[":
            self.lists.append(self.key.decode("utf-8", errors="replace"))
            if self.max_bytes is not None and len(self.lists) == 1:
                self.items = _ArrayScanner(self.max_bytes)
                return found.start()  # the list's scan starts at its bracket
        self.in_string = mark == b'"'
        self.in_key = self.in_string and self.depth == 1 and not at_value
        if self.in_key:
            self.key = bytearray()
        self.depth += {b"[": 1, b"{": 1, b"]": -1, b"}": -1}.get(mark, 0)
        self.closed = self.depth == 0 and mark == b"}"
        self.end = found.end()
        return found.end()

    def _string(self, chunk: bytes, pos: int) -> int:
        """Read on in a string from ``pos`` (keeping the start of a key); return where the scan goes on."""
        found = _JSON_STRING.search(chunk, pos)
        end = len(chunk) if found is None else found.end() + 1 if found.group() == b"\\" else found.end()
        if self.in_key and len(self.key) < _KEY_BYTES:
            self.key += chunk[pos : end if found is None or found.group() == b"\\" else found.start()]
            del self.key[_KEY_BYTES:]
        self.in_string = found is None or found.group() == b"\\"
        return end

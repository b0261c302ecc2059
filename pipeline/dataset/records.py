"""Checksummed records of the write-ahead log: how a reader tells a torn tail from damage.

A log segment is a run of records, one per append (after a header record). A crash can only cut
the last record short: that torn tail is an append that was never acknowledged, and is dropped.
Any other record that does not read back as written is damage, of an append that may have been
acknowledged, and is named, never dropped in silence. So every record carries a CRC-32
(``zlib.crc32``, the polynomial of Parquet's page checksums):

- an Arrow segment starts with :data:`MAGIC`, then one *frame* per IPC message: a 12-byte header
  (little-endian uint32 payload length, uint32 CRC-32 of the payload, uint32 CRC-32 of those first
  8 header bytes), then the payload. A header that fails its own checksum is damage, so a flipped
  bit in a length cannot pass for a torn tail; a frame cut short at the end of the file is torn.
- a line of a row segment is ``<crc> <json>\\n``: the CRC-32 of the JSON bytes as 8 lowercase hex
  digits, one space, the JSON. A last piece without its newline is torn, unless its checksum holds
  (then the newline itself was damaged, or a write stopped just before it: either way it is named).

Segments written before checksums (an Arrow segment without :data:`MAGIC`, a row segment whose
header line starts with ``{``) are still read, with only their old torn-tail rule.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

MAGIC = b"RLPIPEF1"  # "rlpipe frames, version 1": cannot start an Arrow IPC stream
_HEADER = struct.Struct("<III")
_CRC_LINE = 9  # 8 hex digits and a space


@dataclass
class LogRead:
    """What a segment holds: its schema and the rows of its sound records, and each damaged
    record named (``problems``: where and what; ``lost``: which rows, as far as known)."""

    schema: pa.Schema | None
    batches: list[pa.RecordBatch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(batch.num_rows for batch in self.batches)


def frame(payload: pa.Buffer | bytes, first: bool) -> list[pa.Buffer | bytes]:
    """One IPC message as a frame, its header and the message (the first frame of a segment led
    by :data:`MAGIC`), to be written in that order without copying the message."""
    view = memoryview(payload)
    head = struct.pack("<II", len(view), zlib.crc32(view))
    header = head + struct.pack("<I", zlib.crc32(head))
    return [(MAGIC if first else b"") + header, payload]


def read_frames(data: bytes) -> tuple[list[memoryview], list[str]]:
    """The payloads of a framed segment's sound frames, and a problem per damaged one.

    A frame whose payload fails its checksum is skipped (its header says where the next one
    starts); a header that fails ends the reading, as nothing after it can be trusted.
    """
    view = memoryview(data)
    payloads: list[memoryview] = []
    problems: list[str] = []
    position = len(MAGIC)
    while len(view) - position >= _HEADER.size:
        length, crc, header_crc = _HEADER.unpack_from(view, position)
        if zlib.crc32(view[position : position + 8]) != header_crc:
            rest = len(view) - position
            problems.append(
                f"frame {len(payloads) + len(problems)} at byte {position}: its header fails "
                f"its checksum; the {rest} bytes from there on cannot be read"
            )
            break
        start = position + _HEADER.size
        if start + length > len(view):
            break  # cut short: a torn tail, never acknowledged
        payload = view[start : start + length]
        if zlib.crc32(payload) == crc:
            payloads.append(payload)
        else:
            problems.append(
                f"frame {len(payloads) + len(problems)} at byte {position} ({length} bytes): "
                "its checksum fails"
            )
        position = start + length
    return payloads, problems


def line(body: bytes) -> bytes:
    """A row segment's line: its JSON ``body`` behind its checksum."""
    return b"%08x %b\n" % (zlib.crc32(body), body)


def checked_lines(data: bytes) -> Iterator[tuple[int, bytes | None, str | None]]:
    """(line number, JSON body or None, problem or None) of each line of a checksummed row
    segment, counting from 1 (the header); a torn last piece yields nothing."""
    pieces = data.split(b"\n")
    for number, piece in enumerate(pieces, 1):
        last = number == len(pieces)
        body = _checked(piece)
        if last and body is None and piece:  # a newline that changed into another byte?
            body = _checked(piece[:-1])
        if last and (not piece or body is None):
            return  # nothing after the last newline, or a torn append
        if last:
            yield (
                number,
                None,
                (
                    f"line {number}, the last, is whole but has no newline: an append torn just "
                    "before it, or damage to an acknowledged one; its rows are not taken"
                ),
            )
        elif body is None:
            yield number, None, f"line {number} fails its checksum"
        else:
            yield number, body, None


def plain_lines(data: bytes) -> Iterator[tuple[int, bytes | None, str | None]]:
    """The same for a row segment from before checksums: its complete lines, unchecked."""
    pieces = data.split(b"\n")
    for number, piece in enumerate(pieces[:-1], 1):
        yield number, piece, None


def _checked(piece: bytes) -> bytes | None:
    if len(piece) < _CRC_LINE or piece[8:9] != b" ":
        return None
    try:
        crc = int(piece[:8], 16)
    except ValueError:
        return None
    body = piece[_CRC_LINE:]
    return body if zlib.crc32(body) == crc else None

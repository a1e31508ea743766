"""HTTP/2 and gRPC wire details: frame headers, HPACK literals, timeouts, status trailers.

Only what a unary gRPC server needs (RFC 9113, RFC 7541, the gRPC over HTTP/2 spec).
Header blocks the server sends use HPACK literals without indexing, so the server keeps
no encoder state; blocks it receives are decoded by ``hpack.Decoder`` (one per connection).
"""

from __future__ import annotations

import struct

import grpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The client connection preface that opens every HTTP/2 connection."""

# Frame types.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9

# Frame flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes (RST_STREAM, GOAWAY).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

# Settings identifiers.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

FRAME_HEADER = struct.Struct(">IBI")
"""Length (24 bits) and type (8 bits) as one word, flags, stream id: 9 bytes."""
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: its 9-byte header and ``payload``."""
    return FRAME_HEADER.pack((len(payload) << 8) | kind, flags, stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    """A SETTINGS frame carrying ``settings``."""
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """The (identifier, value) pairs of a SETTINGS payload (its length is checked by the caller)."""
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    """A WINDOW_UPDATE frame."""
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    """A RST_STREAM frame."""
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    """A GOAWAY frame."""
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def u32(payload: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """The big-endian 32-bit word at ``offset``."""
    value: int = _U32.unpack_from(payload, offset)[0]
    return value


# ---------------------------------------------------------------------- HPACK literals


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix; ``first`` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0) + value


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal without indexing, with a literal name."""
    return b"\x00" + _string(name) + _string(value)


# ``:status: 200`` is static entry 8; ``content-type`` is static entry 31.
STATUS_200 = b"\x88"
RESPONSE_HEADERS = STATUS_200 + _integer(31, 4, 0) + _string(b"application/grpc")
"""The header block that opens every gRPC response."""

OK_TRAILERS = literal(b"grpc-status", b"0")
"""The trailer block of a successful call."""


def _percent_encode(message: str) -> bytes:
    # The gRPC spec: printable ASCII except '%' goes as is, every other byte as %XX.
    out = bytearray()
    for byte in message.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def status_trailers(
    code: grpc.StatusCode, message: str = "", metadata: tuple[tuple[str, str], ...] = ()
) -> bytes:
    """The trailer block of a call that ended with ``code`` (its ``details`` and metadata)."""
    value: int = code.value[0]
    block = literal(b"grpc-status", str(value).encode())
    if message:
        block += literal(b"grpc-message", _percent_encode(message))
    for key, item in metadata:
        block += literal(key.lower().encode("ascii"), item.encode("latin-1"))
    return block


# ---------------------------------------------------------------------- grpc-timeout

_TIMEOUT_UNITS = {
    ord("H"): 3600.0,
    ord("M"): 60.0,
    ord("S"): 1.0,
    ord("m"): 1e-3,
    ord("u"): 1e-6,
    ord("n"): 1e-9,
}


def parse_timeout(value: bytes) -> float | None:
    """Seconds from a ``grpc-timeout`` value (``100m``, ``5S``); None when malformed."""
    if len(value) < 2 or len(value) > 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit

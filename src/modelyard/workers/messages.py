"""Typed messages between the server, the fork server and worker processes.

Only these frozen dataclasses cross a process boundary, and never as pickles: each
is encoded as a small JSON object (orjson) with a one-letter tag. The server never
unpickles anything a worker sends, so a misbehaving model cannot run code in the
server; errors come back as :class:`ErrorInfo` data and the parent rebuilds the
exception class from its code. Tensor *data* never travels here: :class:`TensorMeta`
only says where a tensor lies in the worker's shared-memory region.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

from modelyard.runtimes.base import RuntimeSpec, TensorSpec

MAX_MESSAGE_BYTES = 192 * 1024
"""Largest encoded message; one SOCK_SEQPACKET datagram must fit the socket buffer."""
_MAX_TEXT_CHARS = 16 * 1024


class MessageError(ValueError):
    """A datagram that is not a valid message (unknown tag, missing field)."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error as data: a :class:`~modelyard.errors.ErrorCode` value, message, traceback."""

    code: str
    message: str
    traceback_text: str = ""


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Where one tensor lies in the shared region.

    ``dtype`` is a numpy dtype string (``<f4``) for fixed-width data, or ``BYTES`` /
    ``STR`` for object arrays stored length-prefixed (``STR`` comes back as ``str``).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Hello:
    """Worker → server, once, as soon as the worker runs."""

    pid: int
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Load:
    """Server → worker: load this model."""

    seq: int
    spec: RuntimeSpec
    memory_limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Loaded:
    """Worker → server: the model loaded; its tensors."""

    seq: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    supports_batching: bool
    load_s: float


@dataclass(frozen=True, slots=True)
class Infer:
    """Server → worker: run one batch whose inputs are in the region."""

    seq: int
    region_bytes: int
    tensors: tuple[TensorMeta, ...]


@dataclass(frozen=True, slots=True)
class InferDone:
    """Worker → server: outputs are in the region (which may have grown)."""

    seq: int
    region_bytes: int
    tensors: tuple[TensorMeta, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    """Worker → server: request ``seq`` (a load or a batch) failed."""

    seq: int
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Stop:
    """Server → worker: close the runtime and exit."""

    seq: int = 0


@dataclass(frozen=True, slots=True)
class ForkServerReady:
    """Fork server → server: imports done; ``threads`` it runs (ideally 1 or ORT's idle one)."""

    pid: int
    threads: int
    import_s: float


@dataclass(frozen=True, slots=True)
class SpawnWorker:
    """Server → fork server: fork a worker on the two file descriptors sent alongside
    (its channel socket and its region memfd of ``region_bytes``)."""

    token: int
    region_bytes: int


@dataclass(frozen=True, slots=True)
class WorkerSpawned:
    """Fork server → server: the worker for ``token`` runs as ``pid``."""

    token: int
    pid: int


@dataclass(frozen=True, slots=True)
class SpawnFailed:
    """Fork server → server: the fork for ``token`` failed."""

    token: int
    message: str


@dataclass(frozen=True, slots=True)
class WorkerExited:
    """Fork server → server: a worker was reaped; ``returncode`` as subprocess reports it."""

    pid: int
    returncode: int


Message = (
    Hello
    | Load
    | Loaded
    | Infer
    | InferDone
    | Failed
    | Stop
    | ForkServerReady
    | SpawnWorker
    | WorkerSpawned
    | SpawnFailed
    | WorkerExited
)


def _clip(text: str) -> str:
    if len(text) <= _MAX_TEXT_CHARS:
        return text
    half = _MAX_TEXT_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - _MAX_TEXT_CHARS} characters cut] ...\n{text[-half:]}"


def _tensors_out(tensors: tuple[TensorMeta, ...]) -> list[list[object]]:
    return [[t.name, t.dtype, t.shape, t.offset, t.nbytes] for t in tensors]


def _tensors_in(rows: list[list[Any]]) -> tuple[TensorMeta, ...]:
    return tuple(TensorMeta(r[0], r[1], tuple(r[2]), r[3], r[4]) for r in rows)


def _specs_out(specs: tuple[TensorSpec, ...]) -> list[list[object]]:
    return [[s.name, s.datatype, s.shape] for s in specs]


def _specs_in(rows: list[list[Any]]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(r[0], r[1], tuple(r[2])) for r in rows)


def _to_wire(msg: Message) -> dict[str, object]:
    if isinstance(msg, Infer):
        return {"t": "i", "s": msg.seq, "r": msg.region_bytes, "ts": _tensors_out(msg.tensors)}
    if isinstance(msg, InferDone):
        return {"t": "d", "s": msg.seq, "r": msg.region_bytes, "ts": _tensors_out(msg.tensors)}
    if isinstance(msg, Failed):
        e = msg.error
        return {"t": "f", "s": msg.seq, "e": [e.code, _clip(e.message), _clip(e.traceback_text)]}
    if isinstance(msg, Hello):
        return {"t": "h", "s": msg.seq, "pid": msg.pid}
    if isinstance(msg, Load):
        return {"t": "l", "s": msg.seq, "spec": asdict(msg.spec), "lim": msg.memory_limit_bytes}
    if isinstance(msg, Loaded):
        return {
            "t": "L",
            "s": msg.seq,
            "in": _specs_out(msg.inputs),
            "out": _specs_out(msg.outputs),
            "b": msg.supports_batching,
            "ls": msg.load_s,
        }
    if isinstance(msg, Stop):
        return {"t": "x", "s": msg.seq}
    if isinstance(msg, ForkServerReady):
        return {"t": "R", "pid": msg.pid, "th": msg.threads, "is": msg.import_s}
    if isinstance(msg, SpawnWorker):
        return {"t": "S", "k": msg.token, "r": msg.region_bytes}
    if isinstance(msg, WorkerSpawned):
        return {"t": "P", "k": msg.token, "pid": msg.pid}
    if isinstance(msg, SpawnFailed):
        return {"t": "F", "k": msg.token, "m": _clip(msg.message)}
    return {"t": "E", "pid": msg.pid, "rc": msg.returncode}


def _from_wire(d: dict[str, Any]) -> Message:
    t = d["t"]
    if t == "i":
        return Infer(d["s"], d["r"], _tensors_in(d["ts"]))
    if t == "d":
        return InferDone(d["s"], d["r"], _tensors_in(d["ts"]))
    if t == "f":
        code, message, tb = d["e"]
        return Failed(d["s"], ErrorInfo(code, message, tb))
    if t == "h":
        return Hello(d["pid"], d["s"])
    if t == "l":
        spec = dict(d["spec"])
        return Load(d["s"], RuntimeSpec(**spec), d["lim"])
    if t == "L":
        return Loaded(d["s"], _specs_in(d["in"]), _specs_in(d["out"]), d["b"], d["ls"])
    if t == "x":
        return Stop(d["s"])
    if t == "R":
        return ForkServerReady(d["pid"], d["th"], d["is"])
    if t == "S":
        return SpawnWorker(d["k"], d["r"])
    if t == "P":
        return WorkerSpawned(d["k"], d["pid"])
    if t == "F":
        return SpawnFailed(d["k"], d["m"])
    if t == "E":
        return WorkerExited(d["pid"], d["rc"])
    raise MessageError(f"unknown message tag {t!r}")


def encode(msg: Message) -> bytes:
    """One datagram; raises MessageError past :data:`MAX_MESSAGE_BYTES`."""
    data = orjson.dumps(_to_wire(msg))
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"{type(msg).__name__} message is {len(data)} bytes, over the limit")
    return data


def decode(data: bytes | bytearray | memoryview) -> Message:
    """The message in one datagram; MessageError when it is not one."""
    try:
        obj = orjson.loads(data)
        return _from_wire(obj)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, MessageError):
            raise
        raise MessageError(f"malformed message: {type(exc).__name__}: {exc}") from None

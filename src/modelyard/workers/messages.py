"""Typed messages between the server, the fork server and worker processes.

Only these frozen msgspec structs cross a process boundary, and never as pickles: each
is encoded as a MessagePack array whose first item is a one-letter tag, and decoded
against the union of the tagged types, so an unknown tag, a missing field or a field of
the wrong type is a :class:`MessageError` (a protocol error), never a message of another
kind. The server never unpickles anything a worker sends, so a misbehaving model cannot
run code in the server; errors come back as :class:`ErrorInfo` data and the parent
rebuilds the exception class from its code. Tensor *data* never travels here:
:class:`TensorMeta` only says where a tensor lies in the worker's shared-memory region.
"""

from __future__ import annotations

import msgspec

from modelyard.protocol.generate import TokenLogprob
from modelyard.runtimes.base import RuntimeSpec, TensorSpec
from modelyard.runtimes.generation import GenerationJob, GenerationStats

MAX_MESSAGE_BYTES = 192 * 1024
"""Largest encoded message; one SOCK_SEQPACKET datagram must fit the socket buffer."""
_MAX_TEXT_CHARS = 16 * 1024


class MessageError(ValueError):
    """A datagram that is not a valid message (unknown tag, missing or mistyped field)."""


class ErrorInfo(msgspec.Struct, frozen=True, array_like=True):
    """An error as data: a :class:`~modelyard.errors.ErrorCode` value, message, traceback."""

    code: str
    message: str
    traceback_text: str = ""


class TensorMeta(msgspec.Struct, frozen=True, array_like=True):
    """Where one tensor lies in the shared region.

    ``dtype`` is a numpy dtype string (``<f4``) for fixed-width data, or ``BYTES`` /
    ``STR`` for object arrays stored length-prefixed (``STR`` comes back as ``str``).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class Hello(msgspec.Struct, frozen=True, array_like=True, tag="h"):
    """Worker → server, once, as soon as the worker runs."""

    pid: int
    seq: int = 0


class Warm(msgspec.Struct, frozen=True, array_like=True, tag="w"):
    """Server → spare worker, while it idles: start these runtimes ahead (their
    process-wide state: ONNX Runtime's environment and kernel registry), so that the
    model's own load skips what every first load of a process pays."""

    kinds: tuple[str, ...]


class Load(msgspec.Struct, frozen=True, array_like=True, tag="l"):
    """Server → worker: load this model."""

    seq: int
    spec: RuntimeSpec
    memory_limit_bytes: int | None = None
    warm_up: bool = False
    """Run one generated batch right after the load (a tensor model without configured
    warm-up inputs), saving the server a round trip; a generative model: decode one
    token (left to the first request's prompt when one waits for the load)."""
    measure: bool = False
    """Then read this process's own memory (``smaps_rollup``) into the reply."""


class Loaded(msgspec.Struct, frozen=True, array_like=True, tag="L"):
    """Worker → server: the model loaded; its tensors."""

    seq: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    supports_batching: bool
    load_s: float
    context_length: int = 0
    """Tokens per sequence of a generative model; 0 for tensor models."""
    parallel: int = 0
    """Sequences a generative model decodes together; 0 for tensor models."""
    kv_cache_bytes: int = 0
    """The KV cache a generative model allocated."""
    warmup_s: float = -1.0
    """Seconds of the warm-up run after the load (``Load.warm_up``); -1: none was run."""
    rss_bytes: int = -1
    """The worker's memory after load and warm-up (``Load.measure``); -1: not measured."""
    uss_bytes: int = 0
    pss_bytes: int = 0
    swap_bytes: int = 0
    warmed: tuple[str, ...] = ()
    """The runtimes this worker had started ahead, as a spare (:class:`Warm`)."""


class Infer(msgspec.Struct, frozen=True, array_like=True, tag="i"):
    """Server → worker: run one batch whose inputs are in the region."""

    seq: int
    region_bytes: int
    tensors: tuple[TensorMeta, ...]


class InferDone(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    """Worker → server: outputs are in the region (which may have grown)."""

    seq: int
    region_bytes: int
    tensors: tuple[TensorMeta, ...]


class Generate(msgspec.Struct, frozen=True, array_like=True, tag="g"):
    """Server → worker: generate text for a generative model's job (``job.seq``)."""

    job: GenerationJob
    adapter: str = ""
    """The LoRA adapter (its model's name, :class:`AttachAdapter`) whose context runs the
    job; empty: the worker's own model."""


class Chunk(msgspec.Struct, frozen=True, array_like=True, tag="c"):
    """Worker → server: text produced for job ``seq``, sent as soon as it is produced; the
    last one has ``finish_reason``. Token counts are running totals."""

    seq: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    """Per token, when the job asked for log probabilities."""


class Cancel(msgspec.Struct, frozen=True, array_like=True, tag="k"):
    """Server → worker: stop job ``seq`` (its client went away or its deadline passed)."""

    seq: int


class StatsQuery(msgspec.Struct, frozen=True, array_like=True, tag="q"):
    """Server → worker: report the generation counters (of ``adapter``'s context, if named)."""

    seq: int
    adapter: str = ""


class AttachAdapter(msgspec.Struct, frozen=True, array_like=True, tag="a"):
    """Server → a ``llama_cpp`` worker: read the LoRA adapter in ``spec``'s folder over
    the loaded model and give it a context of its own (``spec``'s options: ``n_ctx``,
    ``parallel``…), named ``spec.model_name``. Answered by :class:`AdapterAttached` or
    :class:`Failed`."""

    seq: int
    spec: RuntimeSpec
    warm_up: bool = False
    """Decode one token in the new context (left to the first request when one waits)."""


class AdapterAttached(msgspec.Struct, frozen=True, array_like=True, tag="A"):
    """Worker → server: the adapter serves; what its context holds."""

    seq: int
    load_s: float
    context_length: int
    parallel: int
    kv_cache_bytes: int
    private_bytes: int
    """How far the worker's resident anonymous memory rose as it attached the adapter
    (its tensors, the context's buffers; the KV cache's pages only once used)."""


class DetachAdapter(msgspec.Struct, frozen=True, array_like=True, tag="z"):
    """Server → worker: stop the adapter's jobs and free it and its context."""

    seq: int
    name: str


class AdapterDetached(msgspec.Struct, frozen=True, array_like=True, tag="Z"):
    """Worker → server: the adapter is gone; ``freed_bytes`` of resident memory with it."""

    seq: int
    freed_bytes: int


class GenerationCounters(msgspec.Struct, frozen=True, array_like=True, tag="Q"):
    """Worker → server: the generative runtime's counters (answer to StatsQuery)."""

    seq: int
    stats: GenerationStats


class Failed(msgspec.Struct, frozen=True, array_like=True, tag="f"):
    """Worker → server: request ``seq`` (a load or a batch) failed."""

    seq: int
    error: ErrorInfo


class Stop(msgspec.Struct, frozen=True, array_like=True, tag="x"):
    """Server → worker: close the runtime and exit."""

    seq: int = 0


class Released(msgspec.Struct, frozen=True, array_like=True, tag="r"):
    """Worker → server, after :class:`Stop` and before the exit: the runtime is closed.

    ``anon_bytes``: how far the process's resident anonymous memory fell as it closed
    (kernel counters, less a margin for their per-CPU drift), i.e. private pages that
    are the operating system's again now; ``unmapped``: the model's weight file is no
    longer mapped. The rest of the worker's memory goes at its exit.
    """

    anon_bytes: int
    unmapped: bool


class ForkServerReady(msgspec.Struct, frozen=True, array_like=True, tag="R"):
    """Fork server → server: imports done; ``threads`` it runs (ideally 1 or ORT's idle one)."""

    pid: int
    threads: int
    import_s: float


class SpawnWorker(msgspec.Struct, frozen=True, array_like=True, tag="S"):
    """Server → fork server: fork a worker on the two file descriptors sent alongside
    (its channel socket and its region memfd of ``region_bytes``)."""

    token: int
    region_bytes: int


class WorkerSpawned(msgspec.Struct, frozen=True, array_like=True, tag="P"):
    """Fork server → server: the worker for ``token`` runs as ``pid``."""

    token: int
    pid: int


class SpawnFailed(msgspec.Struct, frozen=True, array_like=True, tag="F"):
    """Fork server → server: the fork for ``token`` failed."""

    token: int
    message: str


class WorkerExited(msgspec.Struct, frozen=True, array_like=True, tag="E"):
    """Fork server → server: a worker was reaped; ``returncode`` as subprocess reports it."""

    pid: int
    returncode: int


Message = (
    Hello
    | Warm
    | Load
    | Loaded
    | Infer
    | InferDone
    | Generate
    | Chunk
    | Cancel
    | StatsQuery
    | GenerationCounters
    | AttachAdapter
    | AdapterAttached
    | DetachAdapter
    | AdapterDetached
    | Failed
    | Stop
    | Released
    | ForkServerReady
    | SpawnWorker
    | WorkerSpawned
    | SpawnFailed
    | WorkerExited
)

_MESSAGE_TYPES = Message.__args__
_ENCODER = msgspec.msgpack.Encoder()
_DECODER: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)


def _clip(text: str) -> str:
    if len(text) <= _MAX_TEXT_CHARS:
        return text
    half = _MAX_TEXT_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - _MAX_TEXT_CHARS} characters cut] ...\n{text[-half:]}"


def _clipped(msg: Message) -> Message:
    """``msg`` with its free texts (tracebacks, messages) cut to fit one datagram."""
    if isinstance(msg, Failed):
        e = msg.error
        return Failed(msg.seq, ErrorInfo(e.code, _clip(e.message), _clip(e.traceback_text)))
    if isinstance(msg, SpawnFailed):
        return SpawnFailed(msg.token, _clip(msg.message))
    return msg


def encode(msg: Message) -> bytes:
    """One datagram; MessageError for anything not a message or past :data:`MAX_MESSAGE_BYTES`."""
    kind = type(msg)
    if kind is not Infer and kind is not InferDone and kind is not Chunk:  # no free text
        if not isinstance(msg, _MESSAGE_TYPES):
            raise MessageError(f"{kind.__name__} is not a message")
        msg = _clipped(msg)
    data = _ENCODER.encode(msg)
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"{type(msg).__name__} message is {len(data)} bytes, over the limit")
    return data


def decode(data: bytes | bytearray | memoryview) -> Message:
    """The message in one datagram; MessageError when it is not one."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise MessageError(f"malformed message: {exc}") from None

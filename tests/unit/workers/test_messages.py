"""Control messages: every type survives encode/decode; bad datagrams are refused."""

from __future__ import annotations

import re

import msgspec
import pytest

from modelyard.runtimes.base import RuntimeSpec, TensorSpec
from modelyard.workers.messages import (
    MAX_MESSAGE_BYTES,
    AdapterAttached,
    AdapterDetached,
    AttachAdapter,
    DetachAdapter,
    ErrorInfo,
    Failed,
    ForkServerReady,
    Hello,
    Infer,
    InferDone,
    Load,
    Loaded,
    Message,
    MessageError,
    SpawnFailed,
    SpawnWorker,
    Stop,
    TensorMeta,
    WorkerExited,
    WorkerSpawned,
    decode,
    encode,
)

TENSORS = (TensorMeta("x", "<f4", (2, 3), 0, 24), TensorMeta("s", "BYTES", (1,), 64, 9))
SPEC = RuntimeSpec(
    "python", "/m/1", model_name="m", python_class="a:B", share_weights=True, options={"k": "v"}
)
MESSAGES: list[Message] = [
    Hello(pid=42),
    Load(1, SPEC, 256 << 20),
    Load(1, SPEC, None),
    Loaded(1, (TensorSpec("x", "FP32", (-1, 3)),), (TensorSpec("y", "BYTES", ()),), True, 0.5),
    Infer(7, 1 << 20, TENSORS),
    InferDone(7, 2 << 20, ()),
    Failed(7, ErrorInfo("invalid_input", "bad", "Traceback ...")),
    Stop(),
    ForkServerReady(10, 2, 0.25),
    SpawnWorker(3, 1 << 20),
    WorkerSpawned(3, 99),
    SpawnFailed(3, "fork failed"),
    WorkerExited(99, -9),
    AttachAdapter(4, SPEC, warm_up=True),
    AdapterAttached(4, 0.02, 256, 2, 1 << 18, 3 << 20),
    DetachAdapter(5, "m"),
    AdapterDetached(5, 3 << 20),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Message) -> None:
    assert decode(encode(msg)) == msg


def test_long_tracebacks_are_clipped_to_fit_a_datagram() -> None:
    msg = Failed(1, ErrorInfo("internal", "m" * 500_000, "t" * 500_000))
    data = encode(msg)
    assert len(data) <= MAX_MESSAGE_BYTES
    back = decode(data)
    assert isinstance(back, Failed)
    assert "characters cut" in back.error.traceback_text


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "malformed message"),
        (b'{"t": "?"}', "malformed message"),
        (msgspec.msgpack.encode(["?", 1]), "Invalid value '?'"),
        (msgspec.msgpack.encode(["i", 1]), "at least length 4"),
        (msgspec.msgpack.encode(["i", 1, "big", []]), "Expected `int`, got `str`"),
        (msgspec.msgpack.encode(["d", 1, 2, [["y", "<f4", [2], 0]]]), "length 5"),
        (msgspec.msgpack.encode({"t": "i"}), "Expected `array`"),
        (b"", "malformed message"),
    ],
    ids=[
        "not-msgpack",
        "json",
        "unknown-tag",
        "missing-field",
        "mistyped-field",
        "short-tensor-meta",
        "not-an-array",
        "empty",
    ],
)
def test_malformed_datagrams_raise_message_error(data: bytes, why: str) -> None:
    with pytest.raises(MessageError, match=re.escape(why)):
        decode(data)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_no_two_messages_share_a_tag_and_none_decodes_as_another(msg: Message) -> None:
    tags = [type(m).__struct_config__.tag for m in MESSAGES]
    assert len(set(tags)) == len({type(m) for m in MESSAGES})
    assert type(decode(encode(msg))) is type(msg)


@pytest.mark.parametrize("thing", [TensorMeta("x", "<f4", (1,), 0, 4), {"t": "i"}, None])
def test_encoding_something_that_is_no_message_is_refused(thing: object) -> None:
    with pytest.raises(MessageError, match="is not a message"):
        encode(thing)  # type: ignore[arg-type]

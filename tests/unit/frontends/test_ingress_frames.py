"""The ingress tunnel's frames: split however the bytes arrive, scopes and heads round-trip,
and a manager-side :class:`TunnelEnd` answers an ASGI app's response over a real socket pair."""

from __future__ import annotations

import asyncio
import socket

from starlette.types import Receive, Scope, Send

from modelyard.frontends.ingress.frames import (
    BODY,
    HELLO,
    REQUEST,
    RESPONSE_BODY,
    START,
    FrameProtocol,
    body_frame,
    decode_scope,
    decode_start,
    encode_scope,
    encode_start,
    frame,
)
from modelyard.frontends.ingress.tunnel import ABORT, TunnelEnd

SCOPE = {
    "type": "http",
    "method": "POST",
    "scheme": "http",
    "http_version": "1.1",
    "path": "/v2/models/a b/infer",
    "raw_path": b"/v2/models/a%20b/infer",
    "query_string": b"x=1",
    "headers": [(b"content-type", b"application/json"), (b"x-bin", b"\xff\x00")],
    "client": ("127.0.0.1", 5000),
    "server": ("127.0.0.1", 8080),
}


def test_frames_are_split_whatever_the_reads() -> None:
    got: list[tuple[int, int, bytes]] = []
    protocol = FrameProtocol(lambda s, k, p: got.append((s, k, p)), lambda: None)
    data = (
        frame(1, HELLO, b"42")
        + body_frame(7, BODY, b"abc", True)
        + body_frame(7, BODY, b"", False)
        + frame(2**32 - 1, REQUEST, b"x" * 70_000)
    )
    for i in range(0, len(data), 5):  # five bytes at a time, frames cut anywhere
        protocol.data_received(data[i : i + 5])
    assert got == [
        (1, HELLO, b"42"),
        (7, BODY, b"\x01abc"),
        (7, BODY, b"\x00"),
        (2**32 - 1, REQUEST, b"x" * 70_000),
    ]


def test_scope_and_head_round_trip() -> None:
    scope = decode_scope(encode_scope(SCOPE, 1234))
    for key in ("method", "scheme", "http_version", "path", "raw_path", "query_string"):
        assert scope[key] == SCOPE[key]
    assert scope["headers"] == SCOPE["headers"]
    assert scope["client"] == SCOPE["client"]
    assert scope["state"] == {"ingress_pid": 1234}
    head = [(b"content-length", b"2"), (b"x", b"\xe9")]
    assert decode_start(encode_start(201, head)) == (201, head)


async def test_tunnel_end_answers_through_the_app() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message["body"]
            if not message["more_body"]:
                break
        if scope["path"] == "/fail-late":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            raise RuntimeError("after the head")
        if scope["path"] == "/fail":
            raise RuntimeError("before the head")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": body[::-1], "more_body": True})
        await send({"type": "http.response.body", "body": b"!"})

    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    end = TunnelEnd(app)
    await loop.connect_accepted_socket(lambda: end.protocol, sock=ours)
    frames: asyncio.Queue[tuple[int, int, bytes]] = asyncio.Queue()
    ingress = FrameProtocol(lambda s, k, p: frames.put_nowait((s, k, p)), lambda: None)
    await loop.connect_accepted_socket(lambda: ingress, sock=theirs)
    ingress.write(frame(0, HELLO, b"99"))
    for stream, path in ((1, "/ok"), (2, "/fail"), (3, "/fail-late")):
        ingress.write(frame(stream, REQUEST, encode_scope({**SCOPE, "path": path}, 99)))
        ingress.write(body_frame(stream, BODY, b"ab", True) + body_frame(stream, BODY, b"c", False))
    answers: dict[int, list[tuple[int, bytes]]] = {1: [], 2: [], 3: []}
    while not all(
        a and a[-1][0] in (ABORT, RESPONSE_BODY) and a[-1][1][:1] != b"\x01"
        for a in answers.values()
    ):
        stream, kind, payload = await asyncio.wait_for(frames.get(), 10)
        answers[stream].append((kind, payload))
    assert end.pid == 99
    assert answers[1] == [
        (START, encode_start(200, [(b"a", b"b")])),
        (RESPONSE_BODY, b"\x01cba"),
        (RESPONSE_BODY, b"\x00!"),
    ]
    (kind, head), (_, body) = answers[2]
    assert decode_start(head)[0] == 500
    assert b"before the head" in body
    assert [kind for kind, _ in answers[3]] == [START, ABORT]
    await end.close()
    assert ingress.transport is not None
    ingress.transport.close()

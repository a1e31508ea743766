"""The raw infer reader: what it recognises, and everything it leaves to httptools."""

from __future__ import annotations

import pytest

from modelyard.frontends.http.raw_infer import parse_raw_infer

BODY = b'{"inputs": []}'


def _request(target: bytes = b"/v2/models/m/infer", *headers: bytes, body: bytes = BODY) -> bytes:
    head = [b"POST " + target + b" HTTP/1.1", b"Host: test", *headers]
    if not any(h.lower().startswith(b"content-length") for h in headers):
        head.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def test_a_whole_request_is_read_as_uvicorn_would() -> None:
    raw = parse_raw_infer(
        _request(
            b"/v2/models/m.1/versions/2/infer",
            b"Inference-Header-Content-Length:  14 ",
            b"X-Modelyard-Timeout-Ms: 250",
            b"Connection: Keep-Alive",
            b"User-Agent: a b\tc",
        ),
        1 << 20,
    )
    assert raw is not None
    assert (raw.model, raw.version, raw.path) == ("m.1", "2", "/v2/models/m.1/versions/2/infer")
    assert raw.raw_path == b"/v2/models/m.1/versions/2/infer"
    assert raw.body == BODY
    assert (raw.header_length, raw.timeout_ms, raw.keep_alive) == ("14", "250", True)
    # Lower-cased names, trimmed values, every header kept in order (the scope's).
    assert raw.headers == [
        (b"host", b"test"),
        (b"inference-header-content-length", b"14"),
        (b"x-modelyard-timeout-ms", b"250"),
        (b"connection", b"Keep-Alive"),
        (b"user-agent", b"a b\tc"),
        (b"content-length", b"14"),
    ]


def test_connection_close_is_kept() -> None:
    raw = parse_raw_infer(_request(b"/v2/models/m/infer", b"connection: close"), 1 << 20)
    assert raw is not None
    assert not raw.keep_alive
    assert raw.version is None


@pytest.mark.parametrize(
    "data",
    [
        _request()[:-1],  # body still to come
        _request()[:20],  # head still to come
        _request() + _request(),  # pipelined
        _request(b"/v2/models/m/infer?x=1"),
        _request(b"/v2/models/m%20n/infer"),
        _request(b"/v2/models/m/infer/"),
        _request(b"/v2/models/a/b/infer"),
        _request(b"/v2/models//infer"),
        _request(b"/v2/models/m/versions//infer"),
        _request().replace(b"HTTP/1.1", b"HTTP/1.0"),
        _request(b"/v2/models/m/infer", b"Transfer-Encoding: chunked"),
        _request(b"/v2/models/m/infer", b"Expect: 100-continue"),
        _request(b"/v2/models/m/infer", b"Upgrade: websocket"),
        _request(b"/v2/models/m/infer", b"Connection: keep-alive, Upgrade"),
        _request(b"/v2/models/m/infer", b"Content-Length: 14", b"Content-Length: 14"),
        _request(b"/v2/models/m/infer", b"Content-Length: +14"),
        _request(b"/v2/models/m/infer", b"Content-Length: 99"),
        _request(b"/v2/models/m/infer", b"Content-Length: " + b"0" * 5000 + b"14"),
        _request(b"/v2/models/m/infer", b"Bad Name: x"),
        _request(b"/v2/models/m/infer", b"X-Empty:"),
        _request(b"/v2/models/m/infer", b"X-Obs: caf\xc3\xa9"),
        _request(b"/v2/models/m/infer", b" folded: x"),
        _request(b"/v2/models/m/infer", b"X-Ctl: a\x01b"),
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: test\r\n\r\n",  # no Content-Length
        b"GET /v2/models/m/infer HTTP/1.1\r\nHost: test\r\n\r\n",
        b"POST  /v2/models/m/infer HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    ],
)
def test_anything_else_is_left_to_httptools(data: bytes) -> None:
    assert parse_raw_infer(data, 1 << 20) is None


def test_a_body_over_the_limit_is_left_to_the_usual_413() -> None:
    assert parse_raw_infer(_request(), len(BODY)) is not None
    assert parse_raw_infer(_request(), len(BODY) - 1) is None

"""The floors of ``bench_overhead.py``: the least a Python server must do for a request.

``bench_overhead.py`` starts this script as a server: ``python pipeline_floor.py PORT
fixed`` is the **HTTP floor**, a keep-alive HTTP/1.1 server that answers every request
with a fixed v2 body (what any Python server costs at the least);
``python pipeline_floor.py PORT process|inline MODEL`` is the **pipeline floor**, which
does the work no server can skip for the identity model's request, and nothing
else: it parses the request head (``content-length`` only), decodes the v2 JSON body
with orjson, builds the input array, runs the ONNX model (``process``: in a worker
process reached over a SOCK_SEQPACKET pair, the array's bytes as the message and the
output's bytes as the answer; ``inline``: in the server's own process), encodes the v2
JSON answer with orjson and writes it. Requests that arrive while the worker is busy
are sent as one batch when it answers, as modelyard's dynamic batching does.

What it leaves out is everything a server is for beyond that one request: routing,
names and versions checked, shapes and datatypes checked against the model, queue
limits, deadlines, priorities, breakers, metrics, the loads and evictions of many
models, memory limits, errors answered. So modelyard's time minus this floor's is the
cost of those features; this floor minus the HTTP floor is the cost of the work itself.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import orjson

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
_FIXED_BODY = (
    b'{"model_name":"identity","model_version":"1","outputs":[{"name":"output",'
    b'"datatype":"FP32","shape":[1,4],"data":[0.1234,0.5678,0.9012,0.3456]}]}'
)
_FIXED = _HEAD + str(len(_FIXED_BODY)).encode() + b"\r\n\r\n" + _FIXED_BODY
"""The HTTP floor's answer to every request."""


def _session(model: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def worker(fd: int, model: str) -> None:
    """The worker process: run each message's rows, answer with the output's bytes."""
    sock = socket.socket(fileno=fd)
    session = _session(model)
    run = session._sess.run  # the compiled session, as modelyard's worker calls it
    name = session.get_inputs()[0].name
    buf = bytearray(1 << 20)
    while True:
        n = sock.recv_into(buf)
        if n == 0:
            return
        x = np.frombuffer(buf, dtype=np.float32, count=n // 4).reshape(-1, 4)
        (y,) = run(["output"], {name: x}, None)
        sock.send(y.tobytes())


class Runner:
    """Runs batches of rows: in a worker process, or in this process (or none: fixed)."""

    def __init__(self, model: str, mode: str) -> None:
        self.fixed = mode == "fixed"
        self.waiting: list[tuple[asyncio.Transport, int]] = []
        self.rows: list[np.ndarray] = []
        self.sent: list[tuple[asyncio.Transport, int]] = []
        self.busy = False
        if self.fixed:
            self.sock = None
            return
        if mode == "inline":
            session = _session(model)
            self.name = session.get_inputs()[0].name
            self.run = session._sess.run
            self.sock = None
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(theirs.fileno()), model],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.buf = bytearray(1 << 20)
        asyncio.get_running_loop().add_reader(ours.fileno(), self.answered)

    def submit(self, transport: asyncio.Transport, x: np.ndarray) -> None:
        if self.sock is None:
            (y,) = self.run(["output"], {self.name: x}, None)
            answer(transport, y)
            return
        self.waiting.append((transport, x.shape[0]))
        self.rows.append(x)
        if not self.busy:
            self.send()

    def send(self) -> None:
        assert self.sock is not None
        rows = self.rows[0] if len(self.rows) == 1 else np.concatenate(self.rows)
        self.sent, self.waiting, self.rows = self.waiting, [], []
        self.busy = True
        self.sock.send(rows.tobytes())

    def answered(self) -> None:
        assert self.sock is not None
        n = self.sock.recv_into(self.buf)
        y = np.frombuffer(self.buf, dtype=np.float32, count=n // 4).reshape(-1, 4)
        start = 0
        for transport, count in self.sent:
            answer(transport, y[start : start + count])
            start += count
        self.busy = False
        if self.waiting:
            self.send()


def answer(transport: asyncio.Transport, y: np.ndarray) -> None:
    """Encode the v2 answer and write it with its head, in one write."""
    body = orjson.dumps(
        {
            "model_name": "identity",
            "model_version": "1",
            "outputs": [
                {"name": "output", "datatype": "FP32", "shape": y.shape, "data": y.ravel()}
            ],
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    transport.write(b"".join((_HEAD, str(len(body)).encode(), b"\r\n\r\n", body)))


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: heads split at the blank line, bodies by length."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            if self.runner.fixed:
                self.transport.write(_FIXED)
                continue
            tensor = orjson.loads(body)["inputs"][0]
            x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
            self.runner.submit(self.transport, x)


async def serve(port: int, mode: str, model: str) -> None:
    runner = Runner(model, mode)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(runner), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3])
    else:
        import uvloop

        uvloop.run(serve(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""))

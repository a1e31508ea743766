"""The control channel (a SOCK_SEQPACKET socket pair) and the shared tensor region.

Control messages are single datagrams (see ``messages.py``), so the kernel keeps
message boundaries and no framing is needed. Tensor bytes go through a
:class:`SharedRegion`: one memfd per worker, mapped by both processes and grown (never
shrunk) when a batch does not fit. A memfd has no name in ``/dev/shm``, so nothing
can leak there: its pages go back to the system once both processes have closed it,
even when the server itself is killed.

One copy each way: the server copies inputs into the region and the worker's runtime
reads them in place; the worker copies outputs into the region and the server copies
them out (the region is reused by the next batch, so results cannot stay there).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import socket
from collections.abc import Callable, Mapping

import numpy as np

from modelyard.workers.messages import Message, MessageError, TensorMeta, decode, encode

ALIGN_BYTES = 64
"""Every tensor starts on a cache-line boundary."""
MIN_REGION_BYTES = 1 << 20
_RECV_BUFFER_BYTES = 256 * 1024
_BYTES = "BYTES"
_STR = "STR"
_LEN = np.dtype("<u4")
_MAX_VIEWS = 64
"""Cached tensor views per region; a model's calls reuse a handful of layouts."""
_DTYPE_STRS: dict[np.dtype, str] = {}
"""``dtype.str`` by dtype: computing it costs about a microsecond every time."""


class ChannelClosedError(ConnectionError):
    """The other end of the channel has gone (the process exited or closed it)."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of SOCK_SEQPACKET Unix sockets: (server end, worker end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _align(n: int) -> int:
    return (n + ALIGN_BYTES - 1) & ~(ALIGN_BYTES - 1)


def _round_size(n: int) -> int:
    return max(MIN_REGION_BYTES, (n + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE)


class SharedRegion:
    """A growable memfd mapping shared by the server and one worker."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = 0
        self._mm: mmap.mmap | None = None
        self._u8: np.ndarray = np.empty(0, np.uint8)
        self._views: dict[tuple[int, str, tuple[int, ...]], np.ndarray] = {}
        """Typed views of the current mapping by (offset, dtype, shape): requests of one
        model put the same tensors at the same offsets, and building a view (slice, view,
        reshape) costs more than copying a small tensor."""
        self._layout: tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...], tuple[np.ndarray, ...]]
        self._written: tuple[int, tuple[TensorMeta, ...], tuple[np.ndarray, ...], int]
        self._written = (-1, (), (), 0)
        """The last :meth:`write`: its start, metadata, views and end."""
        self._layout = ((), (), ())
        """The last :meth:`write_after`: the tensors it wrote after, their metadata and
        views (a worker's outputs come with the same layout request after request)."""
        self._map(size)

    @classmethod
    def create(cls, size: int = MIN_REGION_BYTES, name: str = "modelyard-tensors") -> SharedRegion:
        """A new region backed by an anonymous memfd (close-on-exec)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        size = _round_size(size)
        os.ftruncate(fd, size)
        return cls(fd, size)

    @property
    def fd(self) -> int:
        """The memfd; send it to the worker."""
        return self._fd

    @property
    def size(self) -> int:
        """Bytes mapped here (the file may be larger if the other side grew it)."""
        return self._size

    def _map(self, size: int) -> None:
        # A new mapping replaces the old one; arrays still viewing the old mapping keep it
        # alive (mmap.resize would refuse while they exist).
        self._mm = mmap.mmap(self._fd, size)
        self._u8 = np.frombuffer(self._mm, dtype=np.uint8)
        self._size = size
        self._views = {}
        self._written = (-1, (), (), 0)
        self._layout = ((), (), ())

    def _view(self, offset: int, dtype: str, shape: tuple[int, ...], nbytes: int) -> np.ndarray:
        """The typed view of ``nbytes`` at ``offset`` (cached for the current mapping)."""
        key = (offset, dtype, shape)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= _MAX_VIEWS:
                self._views.clear()
            view = self._u8[offset : offset + nbytes].view(np.dtype(dtype)).reshape(shape)
            self._views[key] = view
        return view

    def remap(self, size: int) -> None:
        """Follow a growth made by the other process."""
        if size > self._size:
            self._map(size)

    def ensure(self, nbytes: int) -> None:
        """Make at least ``nbytes`` addressable, growing the file by half again or more."""
        if nbytes <= self._size:
            return
        current = os.fstat(self._fd).st_size
        if current < nbytes:
            current = _round_size(max(nbytes, self._size + self._size // 2))
            os.ftruncate(self._fd, current)
        self._map(current)

    def write(
        self, tensors: Mapping[str, np.ndarray], start: int = 0
    ) -> tuple[tuple[TensorMeta, ...], int]:
        """Copy ``tensors`` in from ``start``; returns their metadata and the end offset.

        When they have the last call's names, dtypes and shapes from the same start (a
        model's batches, request after request), only the bytes are copied.
        """
        last_start, metas, views, end = self._written
        if last_start == start and _copy_as_before(tensors, metas, views):
            return metas, end
        metas, end = self._write_new(tensors, start)
        self._written = (start, metas, _views_of(self, metas), end)
        return metas, end

    def _write_new(
        self, tensors: Mapping[str, np.ndarray], start: int
    ) -> tuple[tuple[TensorMeta, ...], int]:
        plan: list[tuple[str, np.ndarray, str, int, int, tuple[np.ndarray, bytes] | None]] = []
        offset = _align(start)
        for name, value in tensors.items():
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            dt = arr.dtype
            if dt.kind == "O":
                kind, lens, blob = _pack_bytes(name, arr)
                nbytes = lens.nbytes + len(blob)
                plan.append((name, arr, kind, offset, nbytes, (lens, blob)))
            else:
                if dt.kind == "V":
                    raise TypeError(f"tensor {name!r} has unsupported dtype {dt}")
                kind = _DTYPE_STRS.get(dt) or _DTYPE_STRS.setdefault(dt, dt.str)
                nbytes = arr.nbytes
                plan.append((name, arr, kind, offset, nbytes, None))
            offset = _align(offset + nbytes)
        self.ensure(offset)
        metas = []
        for name, arr, kind, off, nbytes, packed in plan:
            if packed is None:
                # Same dtype and shape: a plain assignment is a copy, nothing else.
                self._view(off, kind, arr.shape, nbytes)[...] = arr
            else:
                lens, blob = packed
                head = lens.nbytes
                u8 = self._u8
                u8[off : off + head] = lens.view(np.uint8)
                u8[off + head : off + nbytes] = np.frombuffer(blob, dtype=np.uint8)
            metas.append(TensorMeta(name, kind, arr.shape, off, nbytes))
        return tuple(metas), offset

    def write_after(
        self, tensors: Mapping[str, np.ndarray], after: tuple[TensorMeta, ...]
    ) -> tuple[TensorMeta, ...]:
        """Copy ``tensors`` in past every tensor of ``after`` (a worker's outputs after its
        inputs); their metadata, as :meth:`write` gives it.

        When the inputs lie as last time and the outputs have last time's names, dtypes
        and shapes, the copies are all that is done: the metadata and views are the last
        call's (``TensorMeta`` is immutable, so sharing it is safe).
        """
        last_after, metas, views = self._layout
        if last_after == after and _copy_as_before(tensors, metas, views):
            return metas
        metas, _ = self._write_new(tensors, self.end_of(after))
        self._layout = (after, metas, _views_of(self, metas))
        return metas

    def read(self, metas: tuple[TensorMeta, ...], *, copy: bool) -> dict[str, np.ndarray]:
        """Tensors described by ``metas``: views into the region, or copies out of it.

        BYTES/STR tensors are always rebuilt as new object arrays.
        """
        out: dict[str, np.ndarray] = {}
        for m in metas:
            end = m.offset + m.nbytes
            if end > self._size:
                raise ValueError(f"tensor {m.name!r} lies past the shared region ({end} bytes)")
            if m.dtype in (_BYTES, _STR):
                out[m.name] = _unpack_bytes(self._u8[m.offset : end], m.shape, m.dtype == _STR)
                continue
            view = self._view(m.offset, m.dtype, m.shape, m.nbytes)
            # A fresh array object either way: the cached one must not be reshaped by
            # whoever holds the result.
            out[m.name] = view.copy() if copy else view.view()
        return out

    def end_of(self, metas: tuple[TensorMeta, ...]) -> int:
        """First aligned offset past every tensor in ``metas``."""
        return _align(max((m.offset + m.nbytes for m in metas), default=0))

    def close(self) -> None:
        """Drop the mapping and close the memfd (the pages go once the peer closes too)."""
        # mmap holds a duplicate of the memfd until the mapping itself is closed, and the
        # cached views keep the mapping alive: drop them, then close it, so that both
        # descriptors go now rather than whenever the collector frees this object.
        self._u8 = np.empty(0, np.uint8)
        self._views = {}
        self._written = (-1, (), (), 0)
        self._layout = ((), (), ())
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: GC closes it
                mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _views_of(region: SharedRegion, metas: tuple[TensorMeta, ...]) -> tuple[np.ndarray, ...]:
    """The views of ``metas`` to copy the next call's tensors into; none (never reused)
    when one of them is BYTES or STR, whose sizes vary with their contents."""
    if any(m.dtype in (_BYTES, _STR) for m in metas):
        return ()
    return tuple(region._view(m.offset, m.dtype, m.shape, m.nbytes) for m in metas)


def _copy_as_before(
    tensors: Mapping[str, np.ndarray], metas: tuple[TensorMeta, ...], views: tuple[np.ndarray, ...]
) -> bool:
    """Copy ``tensors`` into ``views`` if they have the names, dtypes and shapes of
    ``metas``; False (perhaps after copying some) when they do not."""
    if not views or len(views) != len(tensors):
        return False
    for (name, arr), view, meta in zip(tensors.items(), views, metas, strict=True):
        if (
            type(arr) is not np.ndarray
            or name != meta.name
            or arr.shape != view.shape
            or arr.dtype != view.dtype
        ):
            return False
        view[...] = arr
    return True


def _pack_bytes(name: str, arr: np.ndarray) -> tuple[str, np.ndarray, bytes]:
    flat = arr.reshape(-1)
    items: list[bytes] = []
    is_text = flat.size > 0
    for x in flat:
        if isinstance(x, bytes):
            items.append(x)
            is_text = False
        elif isinstance(x, str):
            items.append(x.encode("utf-8"))
        else:
            raise TypeError(
                f"BYTES tensor {name!r} holds a {type(x).__name__}; expected bytes or str"
            )
    lens = np.fromiter((len(b) for b in items), dtype=_LEN, count=len(items))
    return (_STR if is_text else _BYTES), lens, b"".join(items)


def _unpack_bytes(raw: np.ndarray, shape: tuple[int, ...], is_text: bool) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    head = count * _LEN.itemsize
    lens = raw[:head].view(_LEN)
    data = raw[head:].tobytes()
    ends = np.cumsum(lens, dtype=np.int64).tolist()
    starts = [0, *ends[:-1]] if ends else []  # a zero-element tensor has no elements
    items: list[object]
    if is_text:
        items = [data[a:b].decode("utf-8") for a, b in zip(starts, ends, strict=True)]
    else:
        items = [data[a:b] for a, b in zip(starts, ends, strict=True)]
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(shape)


class BlockingChannel:
    """The worker's end: blocking sends and receives on its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray(_RECV_BUFFER_BYTES)

    def send(self, msg: Message) -> None:
        """Send one message; ChannelClosedError if the server end is gone."""
        try:
            self._sock.send(encode(msg))
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosedError("the server closed the channel") from exc

    def recv(self) -> Message | None:
        """The next message, or None at end of stream."""
        try:
            n = self._sock.recv_into(self._buf)
        except ConnectionResetError:
            return None
        if n == 0:
            return None
        return decode(memoryview(self._buf)[:n])

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()


class LoopChannel:
    """The server's end: non-blocking, read by the event loop's ``add_reader``.

    Each datagram is decoded and handed to ``on_message`` from the loop's own callback,
    with no task or thread in between. The channel stops reading once it becomes useless,
    and says why once: ``on_close`` with the reason when the peer closed it, or
    ``on_protocol_error`` with the :class:`MessageError` when the peer sent something that
    is not a message (without it, ``on_close`` hears of that too).
    """

    def __init__(
        self,
        sock: socket.socket,
        on_message: Callable[[Message], None],
        on_close: Callable[[str], None],
        on_protocol_error: Callable[[MessageError], None] | None = None,
    ) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._buf = bytearray(_RECV_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._on_message = on_message
        self._on_close = on_close
        self._on_protocol_error = on_protocol_error
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading on ``loop``."""
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._readable)

    def _readable(self) -> None:
        # One datagram per callback: the reader is level-triggered, so a second one
        # waiting in the buffer brings us straight back.
        try:
            n = self._sock.recv_into(self._buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if n == 0:
            self._stop_reading()
            self._on_close("closed its channel")
            return
        try:
            msg = decode(self._view[:n])
        except MessageError as exc:
            self._stop_reading()
            if self._on_protocol_error is not None:
                self._on_protocol_error(exc)
            else:
                self._on_close(f"sent a malformed message ({exc})")
            return
        self._on_message(msg)

    def send(self, msg: Message) -> None:
        """Send one datagram without waiting; the worker reads one request at a time, so
        the socket buffer never fills unless the worker has stopped reading."""
        try:
            self._sock.send(encode(msg))
        except BlockingIOError as exc:
            raise ChannelClosedError("the worker is not reading its channel") from exc
        except OSError as exc:
            raise ChannelClosedError(f"the worker's channel is closed: {exc}") from exc

    def _stop_reading(self) -> None:
        if self._loop is not None and self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._loop = None

    def close(self) -> None:
        """Stop reading and close the socket."""
        self._stop_reading()
        self._sock.close()

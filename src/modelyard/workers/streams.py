"""Generation streams over one worker's channel: many at once, each ended exactly once.

A worker process serving a generative model runs several jobs together and sends their
:class:`~modelyard.workers.messages.Chunk` messages as they are produced, interleaved.
:class:`GenerationStreams` (one per worker instance, on the event loop) gives each job
its own queue keyed by ``seq``, turns the messages back into
:class:`~modelyard.protocol.generate.GenerateChunk` objects, and guarantees an end:

* the last chunk (``finish_reason`` set) or a ``Failed`` message ends a stream;
* a consumer that stops early (client gone, deadline passed) sends ``Cancel`` to the
  worker, which frees the sequence and stops sampling for it;
* a worker that dies ends every open stream with the instance's WorkerCrashedError.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable

from modelyard.errors import DeadlineExceededError, InternalError, ServerError
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.runtimes.generation import GenerationJob
from modelyard.workers.answers import AnswerGate
from modelyard.workers.exits import rebuild_error
from modelyard.workers.instance import GenerationCounters
from modelyard.workers.messages import (
    Cancel,
    Chunk,
    Failed,
    Generate,
    Message,
    StatsQuery,
)
from modelyard.workers.messages import GenerationCounters as CountersMessage

_Item = Chunk | ServerError


def generation_job(seq: int, request: GenerateRequest) -> GenerationJob:
    """``request`` as the plain job a generative runtime takes (it crosses a process or
    node boundary), under the worker's sequence number ``seq``."""
    s = request.sampling
    messages = (
        None if request.messages is None else tuple((m.role, m.content) for m in request.messages)
    )
    return GenerationJob(
        seq,
        request.prompt,
        messages,
        s.max_tokens,
        float(s.temperature),
        float(s.top_p),
        s.top_k,
        s.seed,
        s.stop,
        resume_ids=request.resume_token_ids,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        logit_bias=s.logit_bias,
        json_schema=s.json_schema,
        logprobs=s.logprobs,
        chat_context=request.chat_context,
        task=request.task,
        token_ids=request.token_ids,
        add_special=request.add_special,
    )


def generate_chunk(chunk: Chunk) -> GenerateChunk:
    """A worker's ``Chunk`` message as the server's :class:`GenerateChunk`."""
    return GenerateChunk(
        text=chunk.text,
        token_ids=chunk.token_ids,
        finish_reason=chunk.finish_reason,
        prompt_tokens=chunk.prompt_tokens,
        completion_tokens=chunk.completion_tokens,
        logprobs=chunk.logprobs,
    )


class GenerationStreams:
    """The open generation streams and counter queries of one worker."""

    def __init__(
        self, send: Callable[[Message], None], next_seq: Callable[[], int], answers: AnswerGate
    ) -> None:
        self.name = ""
        """The model's name, for messages (set when the instance starts)."""
        self._send = send
        """Sends one message to the worker (raises a ServerError when it is gone)."""
        self._next_seq = next_seq
        self._answers = answers
        """Counts each stream until its first chunk (``answers.py``)."""
        self._streams: dict[int, asyncio.Queue[_Item]] = {}
        self._queries: dict[int, asyncio.Future[Message]] = {}
        """Requests answered by one message (counters, an adapter's attach or detach)."""
        self._dead: ServerError | None = None

    @property
    def open_streams(self) -> int:
        """Streams not ended yet."""
        return len(self._streams)

    def owns(self, msg: Message) -> bool:
        """True when ``msg`` belongs to a stream or a query (and was delivered)."""
        seq = getattr(msg, "seq", None)
        if seq is None:
            return False
        queue = self._streams.get(seq)
        if queue is not None and isinstance(msg, Chunk | Failed):
            queue.put_nowait(msg if isinstance(msg, Chunk) else rebuild_error(msg.error))
            return True
        fut = self._queries.pop(seq, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(msg)
            return True
        return isinstance(msg, Chunk | CountersMessage)  # late: its stream was closed

    def fail_all(self, error: ServerError) -> None:
        """The worker died: every open stream and query ends with ``error``."""
        self._dead = error
        for queue in self._streams.values():
            queue.put_nowait(error)
        for fut in self._queries.values():
            if not fut.done():
                fut.set_exception(error)
        self._queries.clear()

    async def generate(
        self, request: GenerateRequest, adapter: str = ""
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Send the job (to ``adapter``'s context, if named) and yield its chunks;
        closing early cancels it in the worker."""
        if self._dead is not None:
            raise self._dead
        seq = self._next_seq()
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._streams[seq] = queue
        finished = False
        pending = self._answers.begin()
        try:
            self._send(Generate(generation_job(seq, request), adapter))
            while True:
                item = await queue.get()
                if isinstance(item, ServerError):
                    finished = True
                    raise item
                finished = item.finish_reason is not None
                yield generate_chunk(item)
                # The consumer is back for more, so it has handled the first chunk (as far
                # as its own consumers go before asking again): work waiting for the gate
                # then does not start while the first chunk is still on its way out.
                pending.end()
                if finished:
                    return
        finally:
            pending.end()
            self._streams.pop(seq, None)
            if not finished and self._dead is None:
                # The consumer left before the end: free the worker's sequence now.
                with contextlib.suppress(ServerError, OSError):
                    self._send(Cancel(seq))

    async def counters(self, timeout_s: float, adapter: str = "") -> GenerationCounters:
        """Ask the worker for its generation counters (``adapter``'s context's, if named)."""
        reply = await self.ask(lambda seq: StatsQuery(seq, adapter), timeout_s, "its counters")
        if isinstance(reply, Failed):
            raise rebuild_error(reply.error)
        if not isinstance(reply, CountersMessage):
            raise InternalError(f"unexpected reply to a counters query: {reply!r}")
        return reply.stats

    async def ask(self, make: Callable[[int], Message], timeout_s: float, what: str) -> Message:
        """Send ``make(seq)`` and return the worker's one reply numbered ``seq``, beside the
        streams (DeadlineExceededError after ``timeout_s``; the worker's death ends it)."""
        if self._dead is not None:
            raise self._dead
        seq = self._next_seq()
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._queries[seq] = fut
        try:
            self._send(make(seq))
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            raise DeadlineExceededError(
                f"the worker of model {self.name!r} did not report {what}"
            ) from None
        finally:
            self._queries.pop(seq, None)

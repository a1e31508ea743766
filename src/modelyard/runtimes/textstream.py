"""Turn generated token bytes into text chunks: UTF-8 held until complete, stop strings cut.

Every generative runtime feeds each token's bytes here, so stop strings and partial
characters mean the same on every API: a character split over several byte tokens is
sent once it is complete, text that could be the start of a stop string is held back
until it is known not to be one, and generation stops before the first stop string (which
is never sent).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


@dataclass(slots=True)
class Piece:
    """Text ready to send, the token ids it came from, and whether a stop string matched."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    stopped: bool = False


class TextStream:
    """Incremental detokenizer with stop strings, one per generated sequence."""

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self._held_ids: list[int] = []
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.stopped = False
        self.text = ""
        """Everything sent so far."""

    def push(self, token_id: int, data: bytes) -> Piece:
        """Add one token's bytes; returns what may be sent now (possibly empty)."""
        if self.stopped:
            return Piece("", [], True)
        self._held += self._decoder.decode(data)
        self._held_ids.append(token_id)
        return self._release(final=False)

    def finish(self) -> Piece:
        """Flush what is held at the end of generation (an incomplete character as U+FFFD)."""
        if self.stopped:
            return Piece("", [], True)
        self._held += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, *, final: bool) -> Piece:
        text = self._held
        cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            piece = Piece(text[:cut], self._held_ids, True)
            self._held, self._held_ids = "", []
            self.text += piece.text
            return piece
        keep = 0 if final else self._partial_stop(text)
        send = text[: len(text) - keep]
        self._held = text[len(send) :]
        if not send:
            return Piece("")
        ids, self._held_ids = self._held_ids, []
        self.text += send
        return Piece(send, ids)

    def _partial_stop(self, text: str) -> int:
        """Length of the longest end of ``text`` that begins some stop string."""
        for n in range(min(self._hold, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0

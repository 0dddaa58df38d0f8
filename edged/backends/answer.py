"""Tokens into an answer's text, shared by every language backend and by both of llama.cpp's
paths (one sequence, or several batched), so that how an answer ends never depends on how it
was scheduled: one Piece per token, UTF-8 completed before it is given out, text that may be
the start of a stop string held back until it is known not to be, and the end at the model's
end of generation, a stop string, or the token limit."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Generator, Sequence

from edged.backends.base import BatchedLanguageSession, Piece, Prompt, Sampling


class AnswerText:
    """One answer's text as its tokens come (`feed`, one Piece per token; the last has a
    finish_reason). `limit` counts the tokens that may be given (max_tokens, or what the
    context has room for)."""

    def __init__(self, detokenize: Callable[[int], bytes], is_end: Callable[[int], bool],
                 stops: Sequence[str], limit: int) -> None:
        self._detokenize = detokenize
        self._is_end = is_end
        self._stops = tuple(dict.fromkeys(stops))
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # text that may be the start of a stop string
        self.limit = limit
        self.count = 0

    def feed(self, token: int) -> Piece:
        if self._is_end(token):
            return Piece(self._held + self._decoder.decode(b"", final=True), "stop")
        self.count += 1
        held = self._held + self._decoder.decode(self._detokenize(token))
        cut = first_stop(held, self._stops)
        if cut is not None:
            return Piece(held[:cut], "stop")
        keep = stop_prefix(held, self._stops)
        text, self._held = held[:len(held) - keep], held[len(held) - keep:]
        if self.count >= self.limit:
            return Piece(text + self._held + self._decoder.decode(b"", final=True), "length")
        return Piece(text)


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def stop_prefix(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` may begin a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def one_answer(session: BatchedLanguageSession, prompt: Prompt, sampling: Sampling
               ) -> Generator[Piece, None, None]:
    """One answer through a batched session's slots (its `generate`, for callers that ask one
    at a time): a slot taken when the first piece is asked for, and given back however the
    answer ends (its end, an error, or the caller letting go of the generator)."""
    slot = session.admit(prompt, sampling)
    try:
        while True:
            for seq, piece in session.step():
                if seq == slot:
                    if isinstance(piece, Exception):
                        raise piece
                    yield piece
                    if piece.finish_reason is not None:
                        return
    finally:
        session.drop(slot)

"""Tool calls in a model's text, one parser per template family, as the text streams (after vLLM's tool parsers).

    p = ToolCallParser("hermes", by="slm")
    for piece in chunks:
        client_text += p.feed(piece)          # content only: a call, even half-written, is held back
    client_text += p.finish()
    p.calls, p.errors                         # the complete calls, and what could not be read as one

Families:
- "hermes" (Qwen, Hermes, the world's models): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block
  per call, after any text.
- "json": the whole answer is one JSON object `{"name", "arguments"}` (or a list of them); anything else is text.
A block that is not a well-formed call (bad JSON, no name, never closed, or begun again before it closed, as a retry
or a mesh takeover does: `chat.without_open_call`) never reaches a client as content: it is dropped and named in
`errors`, which the engine records. `split(text, family)` is the same parse over a whole text, so
a stream and a batch agree on every chunking of the same text.
"""

from __future__ import annotations

import json

from pyrodash.chat import CALL_CLOSE as CLOSE
from pyrodash.chat import CALL_OPEN as OPEN
from pyrodash.chat import ToolCall, new_call_id

FAMILIES = ("hermes", "json")


def _call(obj: object, by: str) -> ToolCall | None:
    """A call from a parsed JSON object with a string `name` and object `arguments` (or `parameters`); else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False), by)


def _held(buf: str, tag: str) -> int:
    """How many characters at the end of `buf` could be the start of `tag` (held back until the next chunk)."""
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if tag.startswith(buf[-k:]):
            return k
    return 0


class ToolCallParser:
    """Content and tool calls of one model's text, fed as it streams (`feed`), ended by `finish`."""

    def __init__(self, family: str = "hermes", by: str = "") -> None:
        if family not in FAMILIES:
            raise ValueError(f"tool-call format {family!r}: use one of {', '.join(FAMILIES)}")
        self.family, self.by = family, by
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self._buf, self._tail, self._inside = "", "", False
        self._json: bool | None = None  # the json family: None undecided, True holding an object, False text

    def feed(self, text: str) -> str:
        """The content of `text` that is safe to show now."""
        self._buf += text
        return self._feed_json() if self.family == "json" else self._feed_hermes()

    def finish(self) -> str:
        """The rest of the content once the text has ended (a call left open is dropped and named in `errors`)."""
        buf, self._buf = self._buf, ""
        if self.family == "json":
            return self._finish_json(buf)
        if self._inside:
            self._inside = False
            self.errors.append(f"{self.by or 'model'}: a tool call was not closed ({CLOSE} missing): dropped")
            return ""
        tail, self._tail = self._tail + buf, ""
        return tail.strip() if self.calls else tail

    # ---- hermes ----------------------------------------------------------------------------------------------
    def _feed_hermes(self) -> str:
        out = []
        while True:
            if self._inside:
                end, again = self._buf.find(CLOSE), self._buf.find(OPEN)
                if again >= 0 and (end < 0 or again < end):  # written again from its start (a retry, a takeover)
                    self.errors.append(
                        f"{self.by or 'model'}: a tool call restarted before it closed: the part dropped"
                    )
                    self._buf = self._buf[again + len(OPEN) :]
                    continue
                if end < 0:
                    return "".join(out)
                self._close(self._buf[:end])
                self._buf, self._inside = self._buf[end + len(CLOSE) :], False
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                self._text(self._buf[:start], out)
                self._buf, self._inside = self._buf[start + len(OPEN) :], True
                continue
            keep = _held(self._buf, OPEN)
            self._text(self._buf[: len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep :]
            return "".join(out)

    def _text(self, text: str, out: list[str]) -> None:
        """Text outside a call: shown at once before the first call; after one, held to the end (`finish` shows it
        without the whitespace that separates calls)."""
        if self.calls:
            self._tail += text
        else:
            out.append(text)

    def _close(self, body: str) -> None:
        try:
            call = _call(json.loads(body), self.by)
        except ValueError:
            call = None
        if call is None:
            self.errors.append(f"{self.by or 'model'}: a tool call that is not a JSON {{name, arguments}}: dropped")
        else:
            self.calls.append(call)

    # ---- json ------------------------------------------------------------------------------------------------
    def _feed_json(self) -> str:
        if self._json is None and self._buf.strip():
            self._json = self._buf.lstrip()[0] in "{["
        if self._json:
            return ""
        if self._json is False:
            out, self._buf = self._buf, ""
            return out
        return ""  # (only whitespace so far)

    def _finish_json(self, buf: str) -> str:
        if not self._json:
            return buf
        self._json = False
        try:
            obj = json.loads(buf)
        except ValueError:
            return buf  # not JSON after all: it is the answer's text
        objs = obj if isinstance(obj, list) else [obj]
        calls = [_call(o, self.by) for o in objs]
        if not objs or any(c is None for c in calls):
            return buf  # JSON, but not calls: text
        self.calls.extend(calls)
        return ""


def split(text: str, family: str = "hermes", by: str = "") -> tuple[str, list[ToolCall], list[str]]:
    """(content, calls, errors) of a whole text: the stream's parse in one piece."""
    p = ToolCallParser(family, by)
    content = p.feed(text) + p.finish()
    return content, p.calls, p.errors

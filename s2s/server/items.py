"""The conversation as a client sees it: its items in order, and where each one lives in the LLM's history.

A client keeps its own copy of the conversation and edits it: the Agents SDKs ``conversation.item.retrieve``
an item after its transcript is done, ``conversation.item.truncate`` the assistant's item after an
interruption (the user heard only part of it), and ``conversation.item.delete`` items when they reset their
history. :class:`Items` answers those from the items the server announced, and carries each edit
over to the session's :class:`~s2s.chat_context.ChatContext`, the history the LLM reads, so that what the model sees
next is what the client kept. A truncated reply keeps the words whose audio the user heard: each piece of
text has the duration of the audio made of it, and the piece the cut falls in keeps its share of words.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from s2s.chat_context import ChatContext
from s2s.server.protocol import ItemRequest, ProtocolError, error_event, event
from s2s.server.responses import Response

MAX_ITEMS = 1000  # the oldest items are forgotten past this (the LLM's own history is shorter still)


@dataclass
class Entry:
    """One item: what the client was shown, and its message in the LLM's history (``role`` None: none)."""

    item: dict[str, Any]
    turn: int | None = None
    role: str | None = None  # user | assistant
    response: Response | None = None  # an assistant message: the reply whose audio it holds
    edited: bool = False  # truncated by the client: its cut transcript stands


class Items:
    """The session's conversation items, oldest first.

    Args:
        chat: the session's conversation (edits reach the history the LLM reads).
    """

    def __init__(self, chat: ChatContext) -> None:
        self.chat = chat
        self._entries: dict[str, Entry] = {}

    def add(self, item: dict[str, Any], turn: int | None = None, role: str | None = None,
            response: Response | None = None) -> str | None:
        """Append ``item``; returns the id of the item before it (None: it is the first)."""
        previous = next(reversed(self._entries), None)
        self._entries[item["id"]] = Entry(item, turn, role, response)
        while len(self._entries) > MAX_ITEMS:
            self._entries.pop(next(iter(self._entries)))
        return previous

    def get(self, item_id: str) -> Entry | None:
        return self._entries.get(item_id)

    def before(self, item_id: str) -> str | None:
        """The id of the item before ``item_id`` (None: it is the first; clients place items by it)."""
        previous = None
        for key in self._entries:
            if key == item_id:
                return previous
            previous = key
        return None

    def assign(self, turn: int, item_ids: tuple[str, ...]) -> None:
        """Typed items became the user's side of ``turn``."""
        for item_id in item_ids:
            if (entry := self._entries.get(item_id)) is not None and entry.role == "user":
                entry.turn = turn

    def forget(self, turn: int) -> list[str]:
        """Drop the items of ``turn`` (a turn the user went on from); returns their ids."""
        void = [item_id for item_id, entry in self._entries.items() if entry.turn == turn]
        for item_id in void:
            del self._entries[item_id]
        return void

    def _user_text(self, turn: int) -> str | None:
        """The user's message of ``turn`` from the items left (a typed turn may join several)."""
        texts = [part.get("text") or part.get("transcript") or "" for entry in self._entries.values()
                 if entry.turn == turn and entry.role == "user" for part in entry.item.get("content", [])]
        return " ".join(text for text in texts if text) or None

    def _edit(self, turn: int | None, role: str | None, content: str | None) -> None:
        if turn is not None and role is not None:
            self.chat.edit(turn, role, content)

    # ------------------------------------------------------------------ the client's requests
    def answer(self, request: ItemRequest) -> list[dict[str, Any]]:
        """The events for a retrieve, delete or truncate: the item, its removal, or its cut, or an error."""
        entry = self._entries.get(request.item_id)
        if entry is None:
            return [error_event(ProtocolError("invalid_value", f"no item '{request.item_id[:80]}' in this "
                                                               f"conversation", "item_id", request.event_id))]
        if request.kind == "retrieve":
            return [event("conversation.item.retrieved", item=entry.item)]
        if request.kind == "delete":
            del self._entries[request.item_id]
            if entry.role == "user" and entry.turn is not None:
                self._edit(entry.turn, "user", self._user_text(entry.turn))
            elif entry.role == "assistant" and entry.response is not None and entry.response.transcript:
                self._edit(entry.turn, "assistant", None)
            elif entry.role in ("system", "assistant") and entry.response is None:  # a message the client added
                self._edit(entry.turn, entry.role, None)
            return [event("conversation.item.deleted", item_id=request.item_id)]
        return self._truncate(entry, request)

    def _truncate(self, entry: Entry, request: ItemRequest) -> list[dict[str, Any]]:
        response = entry.response
        if response is None or entry.role != "assistant":
            return [error_event(ProtocolError("invalid_value", "only an assistant's audio message can be "
                                                               "truncated", "item_id", request.event_id))]
        if request.audio_end_ms > int(response.audio_s * 1000) + 1:
            return [error_event(ProtocolError("invalid_value", f"audio_end_ms {request.audio_end_ms} is past the "
                                                               f"item's audio ({response.audio_s * 1000:.0f} ms)",
                                              "audio_end_ms", request.event_id))]
        heard = response.heard(request.audio_end_ms / 1000)
        entry.item["content"] = [{"type": "output_audio", "transcript": heard}]
        entry.edited = True
        self._edit(entry.turn, "assistant", heard)
        return [event("conversation.item.truncated", item_id=request.item_id, content_index=0,
                      audio_end_ms=request.audio_end_ms)]

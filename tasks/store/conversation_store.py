"""Reads and writes of conversations and their items; a conversation is visible only to its tenant."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from tasks.store.conversation_models import ConversationItemRecord, ConversationRecord


def get_owned_conversation(session: Session, conversation_id: str, tenant: str) -> ConversationRecord | None:
    """Another tenant's conversation is as absent as one that never existed."""
    record = session.get(ConversationRecord, conversation_id)
    return record if record is not None and record.tenant == tenant else None


def take_positions(session: Session, conversation_id: str, count: int) -> int:
    """The first of `count` positions, next after every item added so far. The UPDATE holds the conversation's row
    until the caller commits, so a concurrent addition takes the positions after these."""
    bump = update(ConversationRecord).where(ConversationRecord.id == conversation_id)
    session.execute(bump.values(num_positions=ConversationRecord.num_positions + count))
    taken = session.scalar(select(ConversationRecord.num_positions).where(ConversationRecord.id == conversation_id))
    assert taken is not None, "the caller found the conversation"
    return taken - count


def add_items(session: Session, conversation_id: str, items: list[dict[str, Any]], response_id: str | None) -> None:
    """Append `items` (each with its id), then, with `response_id`, the placeholder its output will replace; the
    caller commits."""
    num_rows = len(items) + (response_id is not None)
    first = take_positions(session, conversation_id, num_rows)
    for offset, item in enumerate(items):
        session.add(ConversationItemRecord(conversation_id=conversation_id, id=item["id"], position=first + offset,
                                           item=item))  # fmt: skip
    if response_id is not None:
        session.add(ConversationItemRecord(conversation_id=conversation_id, id=response_id,
                                           position=first + len(items), response_id=response_id))  # fmt: skip


def conversation_rows(session: Session, conversation_id: str) -> list[ConversationItemRecord]:
    """Every row, placeholders included, oldest first."""
    rows = select(ConversationItemRecord).where(ConversationItemRecord.conversation_id == conversation_id)
    return list(session.scalars(rows.order_by(ConversationItemRecord.position, ConversationItemRecord.seq)))


def replace_placeholder(session: Session, placeholder: ConversationItemRecord, items: list[dict[str, Any]]) -> None:
    """The response's output items take its placeholder's place, once: of two callers settling the same placeholder,
    only the one whose DELETE removed it adds them. Commits."""
    removed = session.execute(delete(ConversationItemRecord).where(ConversationItemRecord.seq == placeholder.seq))
    if removed.rowcount == 1:
        for item in items:
            session.add(ConversationItemRecord(conversation_id=placeholder.conversation_id, id=item["id"],
                                               position=placeholder.position, item=item))  # fmt: skip
    session.commit()


def delete_item(session: Session, row: ConversationItemRecord) -> None:
    session.execute(delete(ConversationItemRecord).where(ConversationItemRecord.seq == row.seq))
    session.commit()


def delete_conversation(session: Session, record: ConversationRecord) -> None:
    """Its items go with it (the responses that ran in it keep their own copies of their input)."""
    session.execute(delete(ConversationItemRecord).where(ConversationItemRecord.conversation_id == record.id))
    session.execute(delete(ConversationRecord).where(ConversationRecord.id == record.id))
    session.commit()

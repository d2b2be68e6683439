"""POST /v1/files, GET /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id}"""

from __future__ import annotations

import logging
import time

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import literal, select, tuple_

from api.batches.file_expiry import checked_expiry_s, form_expires_after
from api.batches.file_objects import file_object
from api.batches.pages import cursor_page, page_limit
from api.errors import APIError
from api.gate.auth import current_principal
from api.gate.body_checks import unsafe_text_reason
from api.gate.idempotency import check_replay, commit_once, idempotency_key, request_hash
from api.services import db_session, services
from tasks.batches.file_content import iter_file_content
from tasks.batches.file_expiry import is_live, live_files
from tasks.batches.models import FileRecord
from tasks.batches.store import new_sortable_id

logger = logging.getLogger(__name__)
bp = Blueprint("files", __name__)
UPLOAD_PURPOSES = ("batch",)
MAX_LIST_LIMIT = 10_000  # OpenAI's bound and default
LIST_ORDERS = ("asc", "desc")
MAX_FILENAME_LENGTH = 512  # the files.filename column


@bp.post("/v1/files")
def create_file() -> Response:
    max_bytes = services().config.max_file_bytes  # the whole form's limit is set in api/gate/request_limits.py
    purpose = request.form.get("purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise APIError(400, f"purpose must be one of {list(UPLOAD_PURPOSES)}", param="purpose")
    upload = request.files.get("file")
    if upload is None:
        raise APIError(400, "Send the file as the multipart field `file`.", param="file")
    content = upload.read(max_bytes + 1)
    if len(content) > max_bytes:
        raise APIError(413, f"The file is larger than {max_bytes} bytes.", param="file", code="file_too_large")
    filename = _checked_filename(upload.filename or "upload.jsonl")
    expiry_s = checked_expiry_s(form_expires_after(request.form), services().config, "expires_after")
    key = idempotency_key()
    expiry_part = () if expiry_s is None else (str(expiry_s).encode(),)
    digest = request_hash(purpose.encode(), filename.encode(), content, *expiry_part)
    principal = current_principal()
    now = int(time.time())
    record = FileRecord(
        id=new_sortable_id("file-"),
        tenant=principal.tenant,
        purpose=purpose,
        filename=filename,
        bytes=len(content),
        created_at=now,
        content=content,
        idempotency_key=key,
        request_hash=digest,
        expires_at=None if expiry_s is None else now + expiry_s,
    )
    stored = _store_once(record, key, digest)
    logger.info("file %s from key %s (tenant %s)", stored.id, principal.key_name, principal.tenant)
    return jsonify(file_object(stored))


def _checked_filename(filename: str) -> str:
    reason = unsafe_text_reason(filename)
    if reason is None and len(filename) > MAX_FILENAME_LENGTH:
        reason = f"is longer than {MAX_FILENAME_LENGTH} characters"
    if reason is not None:
        raise APIError(400, f"The file's name {reason}.", param="file", code="invalid_filename")
    return filename


def _store_once(record: FileRecord, key: str | None, digest: str) -> FileRecord:
    if key is not None and (earlier := _by_key(key)) is not None:
        check_replay(earlier, digest)
        return earlier
    return commit_once(record, key, digest, _by_key)


def _by_key(key: str) -> FileRecord | None:
    tenant = current_principal().tenant
    return db_session().scalar(select(FileRecord).where(FileRecord.tenant == tenant, FileRecord.idempotency_key == key))


def find_file(file_id: str) -> FileRecord:
    """The caller's file; another tenant's, or one expired and not yet reaped, gets the same 404 as a missing one."""
    record = db_session().get(FileRecord, file_id)
    if record is None or record.tenant != current_principal().tenant or not is_live(record, int(time.time())):
        raise APIError(404, f"No such File object: {file_id}", param="id", code="not_found")
    return record


@bp.get("/v1/files")
def list_files() -> Response:
    """The caller's files as OpenAI pages them: newest first (`order=desc`) or oldest, `limit` after the file `after`,
    of one `purpose` if given."""
    limit = page_limit(MAX_LIST_LIMIT, MAX_LIST_LIMIT)
    order = request.args.get("order", "desc")
    if order not in LIST_ORDERS:
        raise APIError(400, f"order must be one of {list(LIST_ORDERS)}", param="order")
    query = select(FileRecord).where(FileRecord.tenant == current_principal().tenant, live_files(int(time.time())))
    if purpose := request.args.get("purpose"):
        query = query.where(FileRecord.purpose == purpose)
    position = tuple_(FileRecord.created_at, FileRecord.id)
    if after := request.args.get("after"):
        cursor = find_file(after)
        after_cursor = tuple_(literal(cursor.created_at), literal(cursor.id))
        query = query.where(position > after_cursor if order == "asc" else position < after_cursor)
    ordering = (
        (FileRecord.created_at, FileRecord.id)
        if order == "asc"
        else (FileRecord.created_at.desc(), FileRecord.id.desc())
    )
    files = list(db_session().scalars(query.order_by(*ordering).limit(limit + 1)))
    data = [file_object(record) for record in files[:limit]]
    return jsonify(cursor_page(data, has_more=len(files) > limit))


@bp.get("/v1/files/<file_id>")
def retrieve_file(file_id: str) -> Response:
    return jsonify(file_object(find_file(file_id)))


@bp.get("/v1/files/<file_id>/content")
def file_content(file_id: str) -> Response:
    record = find_file(file_id)
    content = iter_file_content(services().sessions, record.id, record.bytes)
    return Response(content, mimetype="application/octet-stream", headers={"Content-Length": str(record.bytes)})


@bp.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> Response:
    session = db_session()
    session.delete(find_file(file_id))
    session.commit()
    return jsonify({"id": file_id, "object": "file", "deleted": True})

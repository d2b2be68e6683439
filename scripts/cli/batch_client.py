"""Submit a JSONL file of OpenAI batch lines, watch its progress, and write the results.

    python -m scripts.cli.batch_client submit prompts.jsonl --out results.jsonl [--errors errors.jsonl]
        [--base-url http://127.0.0.1:8000/v1] [--idempotency-key KEY] [--poll-s 0.5]

The API key comes from STEERBATCH_API_KEY (or --api-key, which other users of the machine can see in `ps`).

Uploads the file (`purpose=batch`), creates the batch for the endpoint its first line names, shows a progress bar
until the batch ends, and writes the output file (and the error file, if any). Ctrl-C cancels the
batch; the lines that had finished are still written. The same --idempotency-key resumes a batch already created
instead of starting another.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path

import openai
from openai import OpenAI
from openai.types import Batch
from tqdm import tqdm

logger = logging.getLogger("batch_client")
TERMINAL = ("completed", "failed", "expired", "cancelled")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.cli.batch_client", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="upload, run and download one batch")
    submit.add_argument("input", type=Path, help="JSONL of {custom_id, method, url, body} lines")
    submit.add_argument("--out", type=Path, required=True, help="where the output lines go")
    submit.add_argument("--errors", type=Path, help="where the error lines go (default: <out>.errors.jsonl)")
    submit.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    submit.add_argument("--api-key", default=os.environ.get("STEERBATCH_API_KEY", "unused"))
    submit.add_argument("--idempotency-key", help="reuse to resume the batch an earlier run created")
    submit.add_argument("--poll-s", type=float, default=0.5)
    return parser.parse_args(argv)


def endpoint_of(content: bytes) -> str:
    for raw in content.splitlines():
        if raw.strip():
            return json.loads(raw)["url"]
    raise ValueError("the input file has no lines")


def submit(args: argparse.Namespace) -> int:
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    content = args.input.read_bytes()
    key = args.idempotency_key or uuid.uuid4().hex
    upload = client.files.create(
        file=(args.input.name, content), purpose="batch", extra_headers={"Idempotency-Key": f"{key}-file"}
    )
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint=endpoint_of(content),
        completion_window="24h",  # type: ignore[arg-type]
        extra_headers={"Idempotency-Key": f"{key}-batch"},
    )
    logger.info("batch %s: %s", batch.id, batch.status)  # validating: the api checks the file in the background
    try:
        batch = follow(client, batch.id, args.poll_s)
    except KeyboardInterrupt:
        logger.warning("cancelling %s; the lines that finished are still written", batch.id)
        client.batches.cancel(batch.id)
        batch = follow(client, batch.id, args.poll_s)
    write_results(client, batch, args.out, args.errors or args.out.with_suffix(".errors.jsonl"))
    return 0 if batch.status == "completed" else 1


def follow(client: OpenAI, batch_id: str, poll_s: float) -> Batch:
    """Poll until the batch ends, with a bar of finished lines (completed and failed) over all of them."""
    with tqdm(unit="line", desc=batch_id[:24]) as bar:
        while True:
            batch = client.batches.retrieve(batch_id)
            counts = batch.request_counts
            if counts is not None:
                bar.total = counts.total
                bar.n = counts.completed + counts.failed
                bar.set_postfix(status=batch.status, failed=counts.failed, refresh=False)
                bar.refresh()
            if batch.status in TERMINAL:
                return batch
            time.sleep(poll_s)


def write_results(client: OpenAI, batch: Batch, out: Path, errors: Path) -> None:
    for file_id, path in ((batch.output_file_id, out), (batch.error_file_id, errors)):
        if file_id is None:
            continue
        content = client.files.content(file_id).content
        path.write_bytes(content)
        logger.info("wrote %d lines to %s", content.count(b"\n"), path)
    if batch.errors and batch.errors.data:
        for error in batch.errors.data[:5]:
            logger.warning("line %s: %s", error.line, error.message)
    logger.info("batch %s %s: %s", batch.id, batch.status, batch.request_counts)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    try:
        return submit(args)
    except openai.AuthenticationError as exc:
        logger.error("the API refused the key (%s): set STEERBATCH_API_KEY to a key of yours", exc.message)
        return 1


if __name__ == "__main__":
    sys.exit(main())

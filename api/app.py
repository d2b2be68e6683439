"""The Flask app factory: `create_app(config=None)`, as in Flask's tutorial."""

from __future__ import annotations

import time
import uuid

from flask import Flask, Response, g

from api.batches import batch_routes, file_routes
from api.chat import chat_routes, completion_routes, request_routes, tokenize_routes
from api.conversations import routes as conversation_routes
from api.embeddings import routes as embedding_routes
from api.errors import register_error_handlers
from api.gate.admission_hooks import register_admission_gate
from api.gate.admission_slots import AdmissionGate
from api.gate.auth import authenticate
from api.gate.request_ids import add_request_id_header
from api.gate.request_limits import register_request_limits
from api.messages import routes as message_routes
from api.models import routes as model_routes
from api.models.model_info import load_models
from api.openapi import register_openapi
from api.responses import routes as response_routes
from api.services import Services, close_db_session
from api.status import health_routes, metrics_routes, version_routes
from api.steering import routes as steering_routes
from api.steering import sae_routes
from api.streaming.stream_hub import BLOCK_MS, StreamHub
from tasks.celery_app import create_celery
from tasks.config import Config
from tasks.logs import configure_logging
from tasks.store.db import make_db_engine, make_session_factory
from tasks.streams.redis_keys import RedisKeys, connect_redis


def create_app(config: Config | None = None) -> Flask:
    config = config or Config.from_env()
    configure_logging(config)
    app = Flask(__name__)
    app.json.sort_keys = False
    client = connect_redis(config, block_s=max(config.sse_heartbeat_s, BLOCK_MS / 1000))
    app.extensions["steerbatch"] = Services(
        config=config,
        redis=client,
        streams=StreamHub(client, RedisKeys(config.redis_prefix).stream_hub_wake(uuid.uuid4().hex)),
        sessions=make_session_factory(make_db_engine(config.database_url)),
        celery=create_celery(config),
        models=load_models(config),
        started_at=int(time.time()),
        admission_gate=AdmissionGate(config.admission_slots, config.admission_wait_s),
    )
    blueprints = (
        chat_routes,
        completion_routes,
        metrics_routes,
        model_routes,
        request_routes,
        file_routes,
        batch_routes,
        health_routes,
        sae_routes,
        steering_routes,
        tokenize_routes,
        version_routes,
        response_routes,
        conversation_routes,
        message_routes,
        embedding_routes,
    )
    for blueprint in (module.bp for module in blueprints):
        app.register_blueprint(blueprint)
    register_openapi(app)  # /openapi.json and /docs, describing the routes above
    app.before_request(authenticate)  # every route but the health probes and the contract (DESIGN rule 7)
    register_admission_gate(app)  # before authentication: a burst waits on the gate, not on SQL
    register_request_limits(app, config)  # body size, URL parts, after authentication
    app.after_request(add_rate_limit_headers)
    app.after_request(add_request_id_header)
    app.teardown_appcontext(close_db_session)
    register_error_handlers(app)
    return app


def add_rate_limit_headers(response: Response) -> Response:
    """The calling key's x-ratelimit-* budgets, set by admission, on the response of the request it admitted."""
    response.headers.update(g.pop("rate_limit_headers", {}))
    return response

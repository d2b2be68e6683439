"""The published contract: GET /openapi.json (the OpenAPI 3.1 document, built once per process from the route table
and the pydantic models) and GET /docs (Swagger UI, its HTML, JS and CSS served from the flask-swagger-ui package:
nothing from a CDN). Both are served without a key, as vLLM serves them (api/gate/auth.py's OPEN_ENDPOINTS)."""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app, jsonify
from flask_swagger_ui import get_swaggerui_blueprint

from api.openapi.document import openapi_document
from api.services import services

DOCUMENT_URL = "/openapi.json"
DOCS_URL = "/docs"
DOCS_ENDPOINT = "swagger_ui.show"
bp = Blueprint("openapi", __name__)


@bp.get(DOCUMENT_URL)
def document() -> Response:
    cache = current_app.extensions
    if "openapi_document" not in cache:
        cache["openapi_document"] = openapi_document(current_app, services().model_info.name)
    return jsonify(cache["openapi_document"])


def register_openapi(app: Flask) -> None:
    """After every other blueprint: the document describes the app's URL map."""
    app.register_blueprint(bp)
    app.register_blueprint(get_swaggerui_blueprint(DOCS_URL, DOCUMENT_URL, config={"app_name": "steerbatch API"}))
    app.add_url_rule(DOCS_URL, endpoint=DOCS_ENDPOINT)  # /docs itself, besides the blueprint's /docs/

# One image for the api, the worker and Flower; the command picks the role.
# For GPUs, point pip at the CUDA build of torch 2.13.0 that matches the host's driver (PIP_INDEX_URL).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY api api
COPY tasks tasks
COPY worker worker
COPY scheduler scheduler
COPY steering steering
COPY scripts scripts
COPY migrations migrations
COPY alembic.ini ./
RUN pip install torch==2.13.0 && pip install -e .
EXPOSE 8000 5555
CMD ["gunicorn", "--worker-class", "gthread", "--threads", "64", "--bind", "0.0.0.0:8000", "api.app:create_app()"]

# One image for the api, the worker and Flower; the command picks the role. Its processes run as the unprivileged
# user `steerbatch`, never as root. The api binds 0.0.0.0 inside the container, so it refuses to start until a key
# exists (API_KEY, or `python -m scripts.cli.api_keys create`).
# For GPUs, point pip at the CUDA build of torch 2.13.0 that matches the host's driver (PIP_INDEX_URL).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOST=0.0.0.0
COPY pyproject.toml README.md constraints.txt ./
COPY api api
COPY tasks tasks
COPY worker worker
COPY scheduler scheduler
COPY steering steering
COPY scripts scripts
COPY migrations migrations
COPY alembic.ini ./
RUN pip install torch==2.13.0 && pip install -c constraints.txt -e .
# The code stays root's and read-only to the service; var/ (a SQLite file, if one is used), built/ (the tiny model
# docker-compose builds into a volume mounted there, which takes this folder's owner) and the caches are its own.
RUN useradd --system --create-home --uid 10001 steerbatch \
    && mkdir -p /app/var /app/built /home/steerbatch/.cache/huggingface \
    && chown -R steerbatch:steerbatch /app/var /app/built /home/steerbatch/.cache
USER steerbatch
EXPOSE 8000
CMD ["gunicorn", "-c", "python:api.gunicorn_conf", "api.app:create_app()"]

"""Config is read from the environment once, with types, and passes itself to child processes."""

from __future__ import annotations

import pytest

from tasks.celery_app import create_celery
from tasks.config import Config


def test_defaults_use_embedded_redis_and_sqlite() -> None:
    config = Config.from_env({})
    assert config.is_redis_embedded and config.database_url.startswith("sqlite:///")
    assert config.model_name == "tiny"


def test_environment_overrides_with_types() -> None:
    config = Config.from_env({"REDIS_URL": "redis://h:1/2", "MAX_NUM_SEQS": "8", "SSE_HEARTBEAT_S": "2.5"})
    assert not config.is_redis_embedded
    assert (config.redis_url, config.max_num_seqs, config.sse_heartbeat_s) == ("redis://h:1/2", 8, 2.5)


def test_the_embedded_redis_port_moves_its_url_and_a_given_url_wins() -> None:
    assert Config.from_env({"EMBEDDED_REDIS_PORT": "7001"}).redis_url == "redis://127.0.0.1:7001/0"
    assert Config.from_env({"EMBEDDED_REDIS_PORT": "7001", "REDIS_URL": "redis://h:1/2"}).redis_url == "redis://h:1/2"


def test_bad_number_names_the_variable() -> None:
    with pytest.raises(ValueError, match="MAX_NUM_SEQS"):
        Config.from_env({"MAX_NUM_SEQS": "many"})


def test_to_env_reproduces_the_config() -> None:
    config = Config(model="/m/llama", max_num_seqs=3, redis_url="redis://x:1/0", is_redis_embedded=False)
    assert Config.from_env(config.to_env()) == config


def test_served_models_default_to_the_one_model_and_name_each_workers_queues() -> None:
    config = Config(model="/m/tiny")
    assert config.served_model_paths() == {"tiny": "/m/tiny"}
    assert config.worker_queues == ["interactive.tiny", "bulk.tiny"]
    several = Config(model="/m/tiny", served_models="tiny=/m/tiny, draft = org/draft-1b")
    assert several.served_model_paths() == {"tiny": "/m/tiny", "draft": "org/draft-1b"}
    draft = several.for_model("draft")
    assert (draft.model, draft.model_name, draft.worker_queues) == (
        "org/draft-1b",
        "draft",
        ["interactive.draft", "bulk.draft"],
    )


@pytest.mark.parametrize("served", ["tiny", "tiny=/m,tiny=/n", "=/m", "a=", "a=/m,,b=/n"])
def test_served_models_must_be_distinct_name_path_pairs(served: str) -> None:
    with pytest.raises(ValueError, match="SERVED_MODELS"):
        Config(served_models=served).served_model_paths()


def test_a_worker_has_a_thread_for_every_request_its_engine_runs_and_each_chunk() -> None:
    assert Config(max_num_seqs=64, batch_chunks_in_flight=4).worker_threads == 68
    assert Config(max_num_seqs=64, worker_concurrency=8).worker_threads == 8  # an operator's number stands
    assert create_celery(Config(max_num_seqs=48)).conf.worker_concurrency == 48 + Config().batch_chunks_in_flight

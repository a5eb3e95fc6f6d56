"""The exported metric names are a contract with the platform's alerts and dashboards."""

from __future__ import annotations

import time

import pytest
import trainer_launch  # noqa: F401
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from trainyard_train.metrics import PORT_ENV, TrainMetrics, resolve_port

CONTRACT = {
    "trainyard_train_step",
    "trainyard_train_loss",
    "trainyard_train_samples_per_second",
    "trainyard_train_seconds_since_checkpoint",
    "trainyard_train_last_step_timestamp_seconds",
    "trainyard_train_restarts_total",
    "trainyard_train_world_size",
    "trainyard_train_checkpoint_seconds",
    "trainyard_train_shutdown_grace_seconds",
}


def scrape(metrics: TrainMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_exact_names_and_values() -> None:
    metrics = TrainMetrics()
    metrics.start(world_size=4, restart_count=3, last_checkpoint_time=lambda: time.time() - 30,
                  last_checkpoint_seconds=lambda: 42.5, grace_period_s=100)
    recorded = time.time()
    metrics.record_step(step=12, loss=1.5, samples_per_second=250.0)
    samples = scrape(metrics)
    scraped = time.time()
    assert set(samples) >= CONTRACT
    assert samples["trainyard_train_step"] == 12 and samples["trainyard_train_loss"] == 1.5
    assert samples["trainyard_train_restarts_total"] == 3 and samples["trainyard_train_world_size"] == 4
    assert 29 <= samples["trainyard_train_seconds_since_checkpoint"] < 40
    assert recorded <= samples["trainyard_train_last_step_timestamp_seconds"] <= scraped
    assert samples["trainyard_train_checkpoint_seconds"] == 42.5
    assert samples["trainyard_train_shutdown_grace_seconds"] == 100


def test_env_port_overrides_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_ENV, raising=False)
    assert resolve_port(9108) == 9108
    monkeypatch.setenv(PORT_ENV, "0")
    assert resolve_port(9108) == 0

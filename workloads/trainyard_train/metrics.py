"""Prometheus metrics served by rank 0. The names are a contract with the platform's alert rules and
dashboards: do not rename them."""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from .config import ConfigError

PORT_ENV = "TRAINYARD_METRICS_PORT"


def resolve_port(configured: int) -> int:
    """The env var wins so a job template can move the port without editing the config file."""
    raw = os.environ.get(PORT_ENV)
    if not raw:
        return configured
    if re.fullmatch(r"[0-9]{1,5}", raw) is None or int(raw) > 65535:
        raise ConfigError(f"{PORT_ENV}: expected a port number in [0, 65535], got {raw!r}")
    return int(raw)


class TrainMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.step = Gauge("trainyard_train_step", "Global optimizer step", registry=r)
        self.loss = Gauge("trainyard_train_loss", "Training loss of the last step (mean over ranks)", registry=r)
        self.samples_per_second = Gauge(
            "trainyard_train_samples_per_second", "Global samples per second over the last step", registry=r
        )
        self.seconds_since_checkpoint = Gauge(
            "trainyard_train_seconds_since_checkpoint",
            "Seconds since the last committed checkpoint",
            registry=r,
        )
        self.last_step_timestamp = Gauge(
            "trainyard_train_last_step_timestamp_seconds", "Unix time the last step completed", registry=r
        )
        # A fresh worker process starts this at TORCHELASTIC_RESTART_COUNT, which only grows across
        # restarts, so Prometheus sees a monotonic counter and increase() counts each restart once.
        self.restarts = Counter(
            "trainyard_train_restarts", "Worker-group restarts by the torchrun elastic agent", registry=r
        )
        self.world_size = Gauge("trainyard_train_world_size", "Workers in the current rendezvous", registry=r)
        # The spot path's check (README, "Spot interruptions"): a stop's checkpoint must commit within the grace.
        self.checkpoint_seconds = Gauge(
            "trainyard_train_checkpoint_seconds",
            "Seconds from the start of the last committed checkpoint's save to its commit",
            registry=r,
        )
        self.shutdown_grace_seconds = Gauge(
            "trainyard_train_shutdown_grace_seconds",
            "Seconds the trainer has after SIGTERM to commit its final checkpoint (shutdown.grace_period_s)",
            registry=r,
        )

    def start(self, *, world_size: int, restart_count: int, last_checkpoint_time: Callable[[], float],
              last_checkpoint_seconds: Callable[[], float], grace_period_s: float) -> None:
        self.world_size.set(world_size)
        self.restarts.inc(restart_count)
        self.seconds_since_checkpoint.set_function(lambda: time.time() - last_checkpoint_time())
        self.checkpoint_seconds.set_function(last_checkpoint_seconds)
        self.shutdown_grace_seconds.set(grace_period_s)

    def record_step(self, step: int, loss: float, samples_per_second: float) -> None:
        self.step.set(step)
        self.loss.set(loss)
        self.samples_per_second.set(samples_per_second)
        self.last_step_timestamp.set(time.time())

    def serve(self, port: int) -> None:
        try:
            start_http_server(port, registry=self.registry)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise ConfigError(f"metrics.port: port {port} is already in use on this node (another job or process "
                              f"there serves it; {PORT_ENV} overrides the config)") from exc

"""Checkpoints exported to S3 and restored from there, against a real S3-compatible server (moto's server mode,
run here on localhost): committed copies only, an interrupted upload never taken as committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from trainer_launch import run
from trainyard_train.checkpoint import COMMIT, read_commit, step_dir
from trainyard_train.config import ConfigError
from trainyard_train.export import EXPORT_ENV, CheckpointExport, ExportTarget

BUCKET = "trainyard-checkpoints"
PREFIX = "research/finetune/"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-west-2"}


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3_server}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def keys(s3: Any) -> list[str]:
    return sorted(o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
                  for o in page.get("Contents", []))


@pytest.mark.parametrize("raw", ["s3:/bucket/x", "https://bucket/x/", "s3://B/x/", "s3://bucket//x/", "s3://"])
def test_a_bad_export_uri_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match=f"^{EXPORT_ENV}: expected s3://"):
        ExportTarget.from_env({EXPORT_ENV: raw})


def test_export_uri_forms() -> None:
    assert ExportTarget.from_env({EXPORT_ENV: "s3://b-1.x/ns/job"}) == ExportTarget("b-1.x", "ns/job/")
    assert ExportTarget.from_env({EXPORT_ENV: "s3://bucket/"}) == ExportTarget("bucket", "")
    assert ExportTarget.from_env({}) is None


@pytest.mark.slow
def test_committed_steps_leave_the_cluster_and_an_empty_claim_resumes_from_them(tmp_path: Path, s3: Any) -> None:
    env = {EXPORT_ENV: f"s3://{BUCKET}/{PREFIX}"}
    common = ["checkpoint.interval_steps=5", "checkpoint.keep_last=2"]
    first = tmp_path / "claim-1"
    run(first, ["train.steps=20", *common], nproc=1, torchrun=False, env=env)
    exported = keys(s3)
    # keep_last=2 committed copies, each file then its COMMIT; the same bytes as on the claim.
    for step in (15, 20):
        local = step_dir(first / "checkpoints", step)
        names = sorted(p.name for p in local.iterdir())
        assert [k for k in exported if f"step-{step:08d}/" in k] == [
            f"{PREFIX}checkpoints/step-{step:08d}/{n}" for n in names]
        assert s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoints/step-{step:08d}/{COMMIT}")["Body"].read() == (
            local / COMMIT).read_bytes()
    assert not any("step-00000010" in k or "step-00000005" in k for k in exported)

    # Two interrupted uploads, newer than the last good one: files without COMMIT, and a COMMIT whose file is short.
    twenty = f"{PREFIX}checkpoints/step-00000020/"
    for name in ("__0_0.distcp", ".metadata"):
        body = s3.get_object(Bucket=BUCKET, Key=twenty + name)["Body"].read()
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoints/step-00000025/{name}", Body=body)
    for name in ("__0_0.distcp", ".metadata", COMMIT):
        body = s3.get_object(Bucket=BUCKET, Key=twenty + name)["Body"].read()
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoints/step-00000030/{name}",
                      Body=body[: len(body) // 2] if name == "__0_0.distcp" else body)
    assert CheckpointExport(ExportTarget(BUCKET, PREFIX), keep_last=2).committed_steps() == [15, 20]

    # A new, empty claim: the run starts from the newest committed copy, not from scratch and not from 25 or 30.
    second = tmp_path / "claim-2"
    events = run(second, ["train.steps=23", *common], nproc=1, torchrun=False, env=env).events()
    start = events[0]
    assert start["event"] == "start" and start["step"] == 20, events[:2]
    assert start["resumed_from"].endswith("step-00000020")
    assert read_commit(step_dir(second / "checkpoints", 20))["step"] == 20
    assert events[-1]["event"] == "done" and events[-1]["step"] == 23
    assert f"{PREFIX}checkpoints/step-00000023/{COMMIT}" in keys(s3)  # and its own commits leave too
    # Retention counts committed copies only: the torn 25 and 30 are neither kept in the count nor committed.
    steps = CheckpointExport(ExportTarget(BUCKET, PREFIX), keep_last=2).committed_steps()
    assert steps == [20, 23], steps
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoints/step-00000023/{COMMIT}")["Body"]
                      .read())["step"] == 23

"""What each tier of the dataset cache serves: a read-through of the cache configuration the plan renders, with
real bytes on this machine's media. Prints numbers only.

The chain is the one a training pod's read meets (platform/alluxio.py, README "The data path"): the FUSE pod's
page cache on its node's NVMe (`alluxio.user.client.cache.*`), then the Alluxio workers' memory tier (MEM,
`quota` per worker, evicted from `high` down to `low`), then S3. Capacities, watermarks, worker count and
nodes come from the rendered AlluxioRuntime and the stack's largest dataset job, scaled down by --scale so the run
fits here; the reads are real: S3 is moto's server on loopback (boto3 ranged GETs), the memory tier a directory in
/dev/shm, the NVMe tier a directory on local disk. Alluxio itself does not run here: the placement and eviction
are this model's (LRU pages, as Alluxio's LRU evictor and the client cache's default evictor), not Alluxio's
code. Each epoch every node reads a disjoint share of a fresh permutation of the pages, as the trainer's one
global seeded sample order deals samples to ranks.

    .venv/bin/python bench/cache_tiers.py [--stack prod] [--scale 16384] [--epochs 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from moto.server import ThreadedMotoServer
from trainyard.config.quantity import quantity_bytes
from trainyard.plan.runtime import read_stack, render
from trainyard.plan.writers import is_kubernetes_object, manifest_of

BUCKET = "datasets"
PAGE = 64 * 1024
SHARD_PAGES = 16  # the scaled run's page (Alluxio's client cache default is 1 MiB: alluxio.user.client.cache.page.size)
TIERS = ("nvme", "memory", "s3")


@dataclass
class Tier:
    """A page store in a directory, LRU, evicting to `low` x capacity once above `high` x capacity."""

    root: Path
    capacity: int
    high: float = 1.0
    low: float = 1.0
    pages: OrderedDict[int, int] = field(default_factory=OrderedDict)
    used: int = 0

    def get(self, page: int) -> bytes | None:
        if page not in self.pages:
            return None
        self.pages.move_to_end(page)
        return (self.root / str(page)).read_bytes()

    def put(self, page: int, data: bytes) -> None:
        if len(data) > self.capacity:
            return
        (self.root / str(page)).write_bytes(data)
        self.pages[page] = len(data)
        self.used += len(data)
        if self.used > self.high * self.capacity:
            while self.used > self.low * self.capacity:
                old, size = self.pages.popitem(last=False)
                (self.root / str(old)).unlink()
                self.used -= size


@dataclass
class Config:
    stack: str
    nodes: int
    workers: int
    memory_per_worker: int
    high: float
    low: float
    nvme_per_node: int


def rendered_config(stack: str) -> Config:
    """The cache as the plan renders it, and the node count of the stack's largest job reading a dataset."""
    recording = render(read_stack(stack))
    objects = [manifest_of(r) for r in recording.resources if is_kubernetes_object(r)]
    (runtime,) = [o for o in objects if o["kind"] == "AlluxioRuntime"]
    spec = runtime["spec"]
    (level,) = spec["tieredstore"]["levels"]
    options = dict(o.removeprefix("-D").split("=", 1) for o in spec["fuse"]["jvmOptions"] if o.startswith("-D"))
    nvme = int(options["alluxio.user.client.cache.size"].removesuffix("MB")) * 2**20
    jobs = [o for o in objects if o["kind"] == "Job" and o["apiVersion"].startswith("batch.volcano.sh/")]
    nodes = max((task["replicas"] for job in jobs for task in job["spec"]["tasks"]
                 if any(a.startswith("data.path=") for c in task["template"]["spec"]["containers"]
                        for a in c.get("args", []))), default=1)
    return Config(stack=stack, nodes=nodes, workers=spec["replicas"], memory_per_worker=quantity_bytes(level["quota"]),
                  high=float(level["high"]), low=float(level["low"]), nvme_per_node=nvme)


@contextmanager
def s3_server() -> Iterator[Any]:
    """moto's S3 server on loopback and a boto3 client for it (one per process: moto keeps its buckets in memory)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-west-2",
                          aws_access_key_id="bench", aws_secret_access_key="bench")
    client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    try:
        yield client
    finally:
        server.stop()


@contextmanager
def s3_dataset(client: Any, pages: int) -> Iterator[str]:
    """A dataset of `pages` random pages, one object per shard of SHARD_PAGES pages; the key prefix. (Shards, not
    one object: moto copies an object's whole body to answer a ranged GET.)"""
    prefix = f"shards-{pages}/"
    for shard in range(-(-pages // SHARD_PAGES)):
        count = min(SHARD_PAGES, pages - shard * SHARD_PAGES)
        client.put_object(Bucket=BUCKET, Key=f"{prefix}{shard:06d}", Body=os.urandom(count * PAGE))
    try:
        yield prefix
    finally:
        for shard in range(-(-pages // SHARD_PAGES)):
            client.delete_object(Bucket=BUCKET, Key=f"{prefix}{shard:06d}")


def run(client: Any, config: Config, dataset: int, scale: int, epochs: int,
        seed: int = 0) -> list[dict[str, list[float]]]:
    """Read the dataset `epochs` times through the chain; bytes and seconds served per tier, per epoch."""
    pages = max(1, dataset // scale // PAGE)
    with tempfile.TemporaryDirectory(prefix="trainyard-cache-bench-") as disk, \
            tempfile.TemporaryDirectory(prefix="trainyard-cache-bench-", dir="/dev/shm") as shm, \
            s3_dataset(client, pages) as prefix:
        memory = Tier(Path(shm), config.workers * config.memory_per_worker // scale, config.high, config.low)
        nvme = [Tier(Path(disk) / f"node-{n}", config.nvme_per_node // scale) for n in range(config.nodes)]
        for node_cache in nvme:
            node_cache.root.mkdir()
        order = list(range(pages))
        rng = random.Random(seed)
        results = []
        for _ in range(epochs):
            rng.shuffle(order)
            served: dict[str, list[float]] = {t: [0, 0.0] for t in TIERS}
            # The nodes read side by side: page i of the epoch goes to node i mod nodes.
            for index, page in enumerate(order):
                local = nvme[index % config.nodes]
                start = time.perf_counter()
                if local.get(page) is not None:
                    served_by = "nvme"
                elif (data := memory.get(page)) is not None:
                    local.put(page, data)
                    served_by = "memory"
                else:
                    shard, offset = divmod(page, SHARD_PAGES)
                    body = client.get_object(Bucket=BUCKET, Key=f"{prefix}{shard:06d}",
                                             Range=f"bytes={offset * PAGE}-{(offset + 1) * PAGE - 1}")["Body"].read()
                    memory.put(page, body)
                    local.put(page, body)
                    served_by = "s3"
                served[served_by][0] += PAGE
                served[served_by][1] += time.perf_counter() - start
            results.append(served)
        shutil.rmtree(Path(disk), ignore_errors=True)
    return results


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--scale", type=int, default=16384, help="divide every capacity and the dataset by this "
                        "(more for a dataset that would still exceed --max-scaled)")
    parser.add_argument("--max-scaled", type=int, default=192 * 2**20, help="largest scaled dataset, in bytes")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    config = rendered_config(args.stack)
    memory = config.workers * config.memory_per_worker
    with s3_server() as client:
        report(client, config, memory, args)


def report(client: Any, config: Config, memory: int, args: argparse.Namespace) -> None:
    print(f"cache of stack {config.stack} as rendered: {config.workers} workers x {_size(config.memory_per_worker)} "
          f"memory (evict {config.high:.0%} -> {config.low:.0%}), {_size(config.nvme_per_node)} NVMe per GPU node, "
          f"{config.nodes} nodes reading; pages of {_size(PAGE)} in the scaled run")
    # A dataset the memory tier holds, one only the nodes' NVMe holds, and one larger than a node's NVMe.
    for label, dataset in (("fits in memory", memory // 2), ("5x memory", 5 * memory),
                           ("2x a node's NVMe", 2 * config.nvme_per_node)):
        scale = max(args.scale, -(-dataset // args.max_scaled))
        pages = dataset // scale // PAGE
        print(f"\ndataset {_size(dataset)} ({label}): scaled 1/{scale} to {pages} pages ({_size(pages * PAGE)}), "
              f"memory tier {_size(memory // scale)}, NVMe {_size(config.nvme_per_node // scale)} per node")
        print(f"  {'epoch':>5}  " + "  ".join(f"{t + ' share':>12} {t + ' MB/s':>10}" for t in TIERS))
        for epoch, served in enumerate(run(client, config, dataset, scale, args.epochs), start=1):
            total = sum(b for b, _ in served.values())
            cells = []
            for tier in TIERS:
                bytes_, seconds = served[tier]
                rate = f"{bytes_ / seconds / 1e6:.0f}" if seconds else "-"
                cells.append(f"{bytes_ / total:>12.1%} {rate:>10}")
            print(f"  {epoch:>5}  " + "  ".join(cells))


if __name__ == "__main__":
    main()

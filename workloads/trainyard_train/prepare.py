"""Write a dataset directory the trainer reads: `python -m trainyard_train.prepare --config C --out DIR`.

The synthetic successor-rule corpus at the config's sizes; upload the directory under the dataset bucket's
prefix (`aws s3 sync DIR s3://<datasetBucket>/datasets/<name>`) and set the job's `dataset: <name>`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .config import load_config
from .data import generate_for


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainyard_train.prepare", description=__doc__)
    parser.add_argument("--config", required=True, help="trainer config whose model and data sizes to use")
    parser.add_argument("--out", required=True, type=Path, help="directory to write the shards into")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for the trainer")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    manifest = generate_for(cfg, args.out)
    print(f"wrote {manifest.num_shards} shards of {manifest.records_per_shard} records to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Write a dataset directory the trainer reads.

    python -m trainyard_train.prepare --config C --out DIR [--input PATH]... [--tokenizer FILE]

With ``--input`` (plain-text ``.txt`` files, ``.jsonl`` files of ``{"text": ...}`` objects, or directories of them),
real text: a byte-level BPE tokenizer is trained on the corpus with Hugging Face ``tokenizers`` up to the config's
``model.vocab_size`` (or ``--tokenizer FILE`` supplies one, a ``tokenizer.json``), every document is encoded and
ends with ``<|endoftext|>``, and the token stream is cut into records of ``model.seq_len + 1`` tokens in shards of
``data.records_per_shard`` records (a tail shorter than one record is dropped, and so are the records that do not
fill the last shard; the manifest counts both). The output is a function of the inputs: files are read in sorted
order and BPE training is deterministic. ``manifest.json`` records the tokenizer (its file, kept beside the shards,
and its SHA-256) and the corpus's SHA-256, so a run can say which data it saw.

Without ``--input``, the synthetic successor-rule corpus at the config's sizes (data.py).

Upload the directory under the dataset bucket's prefix (`aws s3 sync DIR s3://<datasetBucket>/datasets/<name>`)
and set the job's `dataset: <name>`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .config import Config, ConfigError, load_config
from .data import MANIFEST, TOKEN_DTYPE, Manifest, atomic_write_bytes, generate_for, shard_key

TEXT_SUFFIXES = (".txt", ".jsonl")
END_OF_TEXT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Corpus:
    files: tuple[Path, ...]
    names: tuple[str, ...]
    """Each file's path relative to the input it was found under (what the content hash covers)."""
    text_key: str

    @classmethod
    def find(cls, inputs: Sequence[Path], text_key: str) -> Corpus:
        found: list[tuple[str, Path]] = []
        for root in inputs:
            if root.is_dir():
                found += [(str(p.relative_to(root)), p) for p in sorted(root.rglob("*"))
                          if p.is_file() and p.suffix in TEXT_SUFFIXES]
            elif root.is_file() and root.suffix in TEXT_SUFFIXES:
                found.append((root.name, root))
            else:
                raise ConfigError(f"--input: {root} is neither a directory nor a {' or '.join(TEXT_SUFFIXES)} file")
        if not found:
            raise ConfigError(f"--input: no {' or '.join(TEXT_SUFFIXES)} files under {', '.join(map(str, inputs))}")
        return cls(files=tuple(p for _, p in found), names=tuple(n for n, _ in found), text_key=text_key)

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for name, path in zip(self.names, self.files, strict=True):
            digest.update(f"{len(name)}:{name}".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.hexdigest()

    def documents(self) -> Iterator[str]:
        for path in self.files:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"--input: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
            if path.suffix == ".txt":
                yield text
                continue
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise ConfigError(f"--input: {path}:{number} is not a JSON object ({exc})") from exc
                value = record.get(self.text_key) if isinstance(record, dict) else None
                if not isinstance(value, str):
                    raise ConfigError(f"--input: {path}:{number} has no string {self.text_key!r} field")
                yield value


def train_tokenizer(corpus: Corpus, vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2's scheme: any UTF-8 text encodes, no unknown token) trained on the corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ConfigError(f"model.vocab_size: {vocab_size} leaves no room for byte-level BPE "
                          f"({len(alphabet)} byte tokens + {END_OF_TEXT})")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], initial_alphabet=alphabet,
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus.documents(), trainer)
    return tokenizer


def load_tokenizer(path: Path, vocab_size: int) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the Rust side raises a plain Exception for any bad file
        raise ConfigError(f"--tokenizer: {path} is not a tokenizers JSON file ({exc})") from exc
    if tokenizer.get_vocab_size() > vocab_size:
        raise ConfigError(f"--tokenizer: {path} has {tokenizer.get_vocab_size()} tokens, more than "
                          f"model.vocab_size ({vocab_size})")
    if tokenizer.token_to_id(END_OF_TEXT) is None:
        raise ConfigError(f"--tokenizer: {path} has no {END_OF_TEXT} token to end documents with")
    return tokenizer


def tokenize(corpus: Corpus, tokenizer: Tokenizer) -> np.ndarray:
    end = tokenizer.token_to_id(END_OF_TEXT)
    pieces = []
    for document in corpus.documents():
        pieces.append(np.asarray(tokenizer.encode(document).ids, dtype=np.int64))
        pieces.append(np.asarray([end], dtype=np.int64))
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


def write_text_dataset(cfg: Config, inputs: Sequence[Path], out: Path, *, tokenizer_file: Path | None,
                       text_key: str) -> Manifest:
    corpus = Corpus.find(inputs, text_key)
    vocab = cfg.model.vocab_size
    tokenizer = load_tokenizer(tokenizer_file, vocab) if tokenizer_file else train_tokenizer(corpus, vocab)
    stream = tokenize(corpus, tokenizer)
    record_len = cfg.model.seq_len + 1
    records = len(stream) // record_len
    per_shard = min(cfg.data.records_per_shard, records)
    if per_shard == 0:
        raise ConfigError(f"--input: the corpus has {len(stream)} tokens, less than one record of "
                          f"model.seq_len + 1 = {record_len}")
    num_shards = records // per_shard
    used = num_shards * per_shard * record_len
    out.mkdir(parents=True, exist_ok=True)
    shards = stream[:used].reshape(num_shards, per_shard, record_len).astype(TOKEN_DTYPE)
    for index, shard in enumerate(shards):
        atomic_write_bytes(out / f"{shard_key(index)}.bin", shard.tobytes())
    tokenizer_json = tokenizer.to_str().encode()
    atomic_write_bytes(out / TOKENIZER_FILE, tokenizer_json)
    manifest = Manifest(num_shards, per_shard, record_len, tokenizer.get_vocab_size(), corpus.sha256())
    meta = {
        **manifest.__dict__,
        "generator": "text",
        "tokenizer": {"file": TOKENIZER_FILE, "kind": "byte-level BPE (tokenizers)",
                      "source": str(tokenizer_file) if tokenizer_file else "trained on this corpus",
                      "sha256": hashlib.sha256(tokenizer_json).hexdigest(), "end_of_text": END_OF_TEXT},
        "content": {"files": list(corpus.names), "tokens": int(len(stream)),
                    "dropped_tokens": int(len(stream) - used)},
    }
    atomic_write_bytes(out / MANIFEST, json.dumps(meta, indent=2).encode())  # last: it marks the directory complete
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainyard_train.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="trainer config whose model and data sizes to use")
    parser.add_argument("--out", required=True, type=Path, help="directory to write the shards into")
    parser.add_argument("--input", type=Path, action="append", help="a .txt/.jsonl file or a directory of them "
                        "(repeatable)")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizers JSON file to use instead of training BPE")
    parser.add_argument("--text-key", default="text", help="the field of each JSONL object holding its text")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for the trainer")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.out.exists() and any(args.out.iterdir()):
            raise ConfigError(f"--out: {args.out} is not empty; prepare writes into a new directory")
        if args.input:
            manifest = write_text_dataset(cfg, args.input, args.out, tokenizer_file=args.tokenizer,
                                          text_key=args.text_key)
        elif args.tokenizer:
            raise ConfigError("--tokenizer: only applies with --input")
        else:
            manifest = generate_for(cfg, args.out)
    except ConfigError as exc:
        print(f"trainyard_train.prepare: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {manifest.num_shards} shards of {manifest.records_per_shard} records to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

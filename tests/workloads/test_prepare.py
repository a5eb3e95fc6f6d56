"""`prepare` on real text: BPE trained with Hugging Face tokenizers, deterministic shards, a manifest that says
which tokenizer and which corpus; the trainer reads the result."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from trainer_launch import TINY, run
from trainyard_train.data import ShardReader
from trainyard_train.prepare import END_OF_TEXT, TOKENIZER_FILE, main

WORDS = ("river", "stone", "light", "ship", "harbour", "lantern", "winter", "morning", "garden", "letter", "signal",
         "bridge", "forest", "quiet", "north", "engine", "paper", "window", "market", "silver")
SIZES = ["model.vocab_size=320", "model.seq_len=32", "data.records_per_shard=16"]


def corpus(root: Path, seed: int = 0) -> Path:
    """Two plain-text files and a JSONL file in a nested directory: a few thousand words of made-up prose."""
    rng = random.Random(seed)

    def prose(sentences: int) -> str:
        return " ".join(" ".join(rng.choices(WORDS, k=rng.randint(5, 12))).capitalize() + "." for _ in range(sentences))

    (root / "books" / "more").mkdir(parents=True)
    (root / "books" / "a.txt").write_text(prose(120) + "\nÉtoile, naïve café — ünïcode.\n")
    (root / "books" / "more" / "b.txt").write_text(prose(120))
    (root / "notes.jsonl").write_text("\n".join(json.dumps({"text": prose(8), "id": i}) for i in range(20)) + "\n")
    (root / "README.md").write_text("not part of the corpus")
    return root


def prepare(out: Path, *extra: str) -> int:
    return main(["--config", str(TINY), "--out", str(out), *extra, *SIZES])


def test_bpe_dataset_is_deterministic_and_says_what_it_holds(tmp_path: Path) -> None:
    source = corpus(tmp_path / "corpus")
    assert prepare(tmp_path / "a", "--input", str(source)) == 0
    assert prepare(tmp_path / "b", "--input", str(source)) == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name

    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(tmp_path / "a" / TOKENIZER_FILE))
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256((tmp_path / "a" / TOKENIZER_FILE).read_bytes()).hexdigest()
    assert manifest["vocab_size"] == tokenizer.get_vocab_size() <= 320
    assert manifest["content"]["files"] == ["books/a.txt", "books/more/b.txt", "notes.jsonl"]  # sorted, .md left out
    assert manifest["record_len"] == 33
    used = manifest["num_shards"] * manifest["records_per_shard"] * 33
    assert used + manifest["content"]["dropped_tokens"] == manifest["content"]["tokens"]

    # The shards are the corpus: the first record decodes to the start of the first file.
    reader = ShardReader(tmp_path / "a")
    first = reader.record(0, 0).astype(np.int64).tolist()
    assert (source / "books" / "a.txt").read_text().startswith(tokenizer.decode(first))
    tokens = np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((tmp_path / "a").glob("shard-*.bin"))])
    assert (tokens == tokenizer.token_to_id(END_OF_TEXT)).sum() >= 2  # between the documents

    # Another corpus, another hash; the same corpus elsewhere, the same hash.
    assert prepare(tmp_path / "c", "--input", str(corpus(tmp_path / "other", seed=1))) == 0
    other = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert other["content_sha256"] != manifest["content_sha256"]
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["content_sha256"] == manifest["content_sha256"]


def test_a_supplied_tokenizer_is_used_as_is(tmp_path: Path) -> None:
    source = corpus(tmp_path / "corpus")
    assert prepare(tmp_path / "a", "--input", str(source)) == 0
    supplied = tmp_path / "mine.json"
    supplied.write_bytes((tmp_path / "a" / TOKENIZER_FILE).read_bytes())
    assert prepare(tmp_path / "b", "--input", str(source / "notes.jsonl"), "--tokenizer", str(supplied)) == 0
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["tokenizer"]["source"] == str(supplied)
    assert manifest["content"]["files"] == ["notes.jsonl"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda root: (root / "x.jsonl").write_text('{"text": "a"}\n{"txt": "b"}\n'), "x.jsonl:2 has no string 'text'"),
        (lambda root: (root / "x.jsonl").write_text("{not json\n"), "x.jsonl:1 is not a JSON object"),
        (lambda root: (root / "x.txt").write_bytes(b"\xff\xfe\x00"), "x.txt is not UTF-8 text"),
        (lambda root: (root / "x.txt").write_text("too short"), "less than one record"),
        (lambda root: (root / "x.md").write_text("ignored"), "no .txt or .jsonl files"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: object, message: str
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    setup(root)  # type: ignore[operator]
    assert prepare(tmp_path / "out", "--input", str(root)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.slow
def test_the_trainer_trains_on_a_prepared_corpus_and_records_its_hash(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert prepare(data, "--input", str(corpus(tmp_path / "corpus"))) == 0
    content = json.loads((data / "manifest.json").read_text())["content_sha256"]
    events = run(tmp_path / "run", [*SIZES, f"data.path={data}", "data.generate=false", "train.steps=30",
                                     "checkpoint.interval_steps=30"], nproc=1, torchrun=False).events()
    start = events[0]
    assert start["event"] == "start" and start["data_sha256"] == content
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert losses[-1] < losses[0]

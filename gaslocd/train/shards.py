"""``gaslocd tokenize``: documents → token shards that training memory-maps.

A corpus larger than memory cannot be read whole, and tokenizing inside every daemon
would repeat the same work on every machine and make their tokens depend on their
library versions. So a corpus is tokenized once, here, with a Hugging Face ``tokenizers``
file, into ``train.bin`` and ``val.bin`` (little-endian uint16, or uint32 when the
vocabulary does not fit 16 bits) and a ``meta.json`` with the vocabulary size and the
dtype: what :func:`gaslocd.train.data.load_corpus` reads, memory-mapped.

Documents are streamed: plain-text files (one document each), JSON lines (one document a
line, its ``text_field``), and Parquet or Arrow files through Hugging Face ``datasets``
in streaming mode; only a batch of documents is ever in memory. Every
:data:`VAL_EVERY`-th document goes to ``val.bin``, so the two splits never share a
document. Each document ends with the tokenizer's end-of-text token when it has one, so
windows that cross documents see the boundary.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

VAL_EVERY = 20  # document i is held out when i % VAL_EVERY == VAL_EVERY - 1 (5%)
BATCH_DOCUMENTS = 256
TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)
DATASET_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow"}
TOKENIZER_FILE = "tokenizer.json"  # next to the shards: what decodes them
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")


@dataclass(frozen=True)
class ShardInfo:
    """What ``meta.json`` records about the shards."""

    vocab_size: int
    dtype: str  # "uint16" or "uint32"
    documents: int
    train_tokens: int
    val_tokens: int
    eos_id: int | None
    tokenizer: str
    text_field: str


def input_files(path: Path) -> list[Path]:
    """The documents' files: ``path`` itself, or every supported file under it, sorted."""
    suffixes = (*TEXT_SUFFIXES, *JSONL_SUFFIXES, *DATASET_SUFFIXES)
    if path.is_file():
        if path.suffix not in suffixes:
            raise ValueError(f"{path}: cannot read {path.suffix!r} files (use {suffixes})")
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no such file or folder: {path}")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    if not files:
        raise ValueError(f"{path} holds no {', '.join(suffixes)} files")
    return files


HUB_PREFIX = "hf:"  # a source named as datasets.load_dataset takes it


@dataclass(frozen=True)
class HubSource:
    """A dataset ``datasets.load_dataset`` finds by name: on the hub (online), or a local
    dataset folder; streamed, never downloaded whole."""

    name: str
    split: str = "train"
    subset: str | None = None

    def documents(self, text_field: str) -> Iterator[str]:
        from datasets import load_dataset  # optional: pip install 'gaslocd[data]'

        rows = load_dataset(self.name, self.subset, split=self.split, streaming=True)
        for number, row in enumerate(rows):
            yield _field(row, text_field, f"{self.name} ({self.split}) row {number}")


def documents(files: Sequence[Path], text_field: str) -> Iterator[str]:
    """Every document of ``files`` in order, streamed."""
    for file in files:
        if file.suffix in TEXT_SUFFIXES:
            yield file.read_text(encoding="utf-8", errors="replace")
        elif file.suffix in JSONL_SUFFIXES:
            with open(file, encoding="utf-8") as lines:
                for number, line in enumerate(lines, 1):
                    if line.strip():
                        yield _field(json.loads(line), text_field, f"{file}:{number}")
        else:
            from datasets import load_dataset  # optional: only Parquet and Arrow need it

            rows = load_dataset(
                DATASET_SUFFIXES[file.suffix], data_files=str(file), split="train", streaming=True
            )
            for number, row in enumerate(rows):
                yield _field(row, text_field, f"{file} row {number}")


def _field(row: Any, text_field: str, where: str) -> str:
    value = row.get(text_field) if isinstance(row, dict) else None
    if not isinstance(value, str):
        raise ValueError(f"{where}: no string field {text_field!r}")
    return value


def _eos_id(tokenizer: Any) -> int | None:
    for name in EOS_NAMES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    return None


def _batches(docs: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == BATCH_DOCUMENTS:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenize_to_shards(
    source: Path | HubSource, tokenizer_file: Path, out: Path, *, text_field: str = "text"
) -> ShardInfo:
    """Tokenize every document of ``source`` (files, or a dataset by name) into
    ``out``/{train,val}.bin + meta.json.

    Written to temporary names and renamed at the end, so an interrupted run leaves no
    shards that look whole.
    """
    from tokenizers import Tokenizer  # optional: pip install 'gaslocd[data]'

    docs = (
        source.documents(text_field)
        if isinstance(source, HubSource)
        else documents(input_files(source), text_field)
    )
    if not tokenizer_file.is_file():
        raise FileNotFoundError(f"no tokenizer file at {tokenizer_file}")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    dtype = np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")
    eos = _eos_id(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    counts, index = {"train": 0, "val": 0}, 0
    temporary = [out / ".train.bin.tmp", out / ".val.bin.tmp"]
    try:
        with open(temporary[0], "wb") as train, open(temporary[1], "wb") as val:
            for batch in _batches(docs):
                for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
                    ids = list(encoding.ids) + ([eos] if eos is not None else [])
                    split = "val" if index % VAL_EVERY == VAL_EVERY - 1 else "train"
                    (val if split == "val" else train).write(np.asarray(ids, dtype).tobytes())
                    counts[split] += len(ids)
                    index += 1
        if counts["val"] == 0 or counts["train"] == 0:
            raise ValueError(
                f"{source}: {index} documents are too few to hold out a validation split "
                f"(every {VAL_EVERY}th document is held out)"
            )
    except BaseException:
        for file in temporary:
            file.unlink(missing_ok=True)
        raise
    for split in ("train", "val"):
        (out / f".{split}.bin.tmp").replace(out / f"{split}.bin")
    info = ShardInfo(
        vocab_size=vocab_size,
        dtype="uint16" if dtype.itemsize == 2 else "uint32",
        documents=index,
        train_tokens=counts["train"],
        val_tokens=counts["val"],
        eos_id=eos,
        tokenizer=str(tokenizer_file),
        text_field=text_field,
    )
    if tokenizer_file.resolve() != (out / TOKENIZER_FILE).resolve():  # checkpoints record it
        shutil.copyfile(tokenizer_file, out / TOKENIZER_FILE)
    (out / "meta.json").write_text(json.dumps(asdict(info), indent=1) + "\n")
    log.info("tokenized %d documents from %s into %s: %s", index, source, out, info)
    return info

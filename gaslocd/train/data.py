"""Token data: a byte tokenizer, corpora with a held-out split, and per-worker batch streams.

Corpora (``load_corpus``):

- ``None`` — the built-in corpus: the ``.py`` sources of the running Python's standard
  library (``sysconfig.get_paths()["stdlib"]``, without ``site-packages``), in sorted order,
  its first ``max_bytes`` (32 MiB) only. Every machine has it and nothing is downloaded;
  machines with different Python versions get somewhat different text, which
  decentralized training tolerates (each worker samples its own stream anyway).
- a text file, or a folder of text files (recursively, sorted by path; hidden entries and
  files containing a NUL byte — binaries — are skipped), byte-level tokenized, read whole
  (never cut); above ``text_limit`` (256 MiB) it is refused with its size.
- pre-tokenized shards of little-endian uint16 or uint32 (nanoGPT's layout, and what
  ``gaslocd tokenize`` writes): a single ``.bin`` file, or a folder holding ``train.bin``
  (and optionally ``val.bin``). They are memory-mapped, never read whole. ``meta.json``
  next to the shards gives ``vocab_size`` and ``dtype`` (uint16 when absent); without it
  the vocabulary is the largest token + 1 rounded up to a multiple of 64 (nanoGPT's
  ``meta.pkl`` is a pickle and is deliberately not read).

Split rule: the validation split is the last 5% (rounded down) of every document — each
file of a text corpus, the single ``.bin`` file — and the rest is training data, so the
two never overlap and every document contributes to both. A shard folder with
``val.bin`` uses it as given.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gaslocd.config import TrainConfig

log = logging.getLogger(__name__)

VAL_FRACTION_DENOMINATOR = 20  # the last 1/20 = 5% of each document is held out
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
BUILTIN_BYTES = 32 * 2**20  # the built-in corpus is a sample of the stdlib sources
TEXT_LIMIT_BYTES = 256 * 2**20  # a larger text corpus goes through `gaslocd tokenize`


class ByteTokenizer:
    """UTF-8 bytes as tokens: no training, no files, every text is representable."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)

    def decode(self, tokens: torch.Tensor | Iterable[int]) -> str:
        values = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        return bytes(values).decode("utf-8", errors="replace")


@dataclass
class Corpus:
    """Training and validation tokens (1-D, stored compactly: uint8 or uint16)."""

    train: torch.Tensor
    val: torch.Tensor
    vocab_size: int
    source: str
    tokenizer_json: str | None = None  # token shards' tokenizer.json (None: bytes)


def load_corpus(
    path: str | None, *, max_bytes: int = BUILTIN_BYTES, text_limit: int = TEXT_LIMIT_BYTES
) -> Corpus:
    """Load a corpus; see the module docstring for what ``path`` may be.

    ``max_bytes`` caps the built-in corpus (it is a sample anyway). A text corpus of the
    user's is never cut: it is read whole up to ``text_limit`` bytes and refused above,
    with its size, since text is held in memory and shards are memory-mapped.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = _text_files(stdlib, suffix=".py")
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return _text_corpus(files, max_bytes, f"python {version} stdlib sources ({stdlib})")
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"corpus path {str(root)!r} does not exist")
    if root.is_file():
        if root.suffix == ".bin":
            return _bin_corpus(root, None)
        return _text_corpus(_within(text_limit, [root]), None, str(root))
    if (root / "train.bin").is_file():
        val = root / "val.bin"
        return _bin_corpus(root / "train.bin", val if val.is_file() else None)
    return _text_corpus(_within(text_limit, _text_files(root, suffix=None)), None, str(root))


def _within(limit: int, files: list[Path]) -> list[Path]:
    total = sum(f.stat().st_size for f in files)
    if total > limit:
        raise ValueError(
            f"the text corpus is {total / 2**20:.1f} MiB, more than the {limit / 2**20:.0f} "
            "MiB read into memory: tokenize it into memory-mapped shards with "
            "'gaslocd tokenize' and pass their folder as --data"
        )
    return files


def _text_files(root: Path, *, suffix: str | None) -> list[Path]:
    """Regular files under ``root`` sorted by relative path; hidden entries skipped."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS]
        for name in filenames:
            if name.startswith(".") or (suffix is not None and not name.endswith(suffix)):
                continue
            found.append(Path(dirpath, name))
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _text_corpus(files: list[Path], max_bytes: int | None, source: str) -> Corpus:
    train, val = bytearray(), bytearray()
    used = skipped = 0
    for file in files:
        budget = None if max_bytes is None else max_bytes - len(train) - len(val)
        if budget is not None and budget <= 0:
            break
        with open(file, "rb") as f:
            data = f.read() if budget is None else f.read(budget)
        if b"\0" in data:
            skipped += 1
            log.debug("skipping binary file %s", file)
            continue
        cut = len(data) - len(data) // VAL_FRACTION_DENOMINATOR
        train += data[:cut]
        val += data[cut:]
        used += int(bool(data))
    if not train:
        raise ValueError(f"corpus {source} is empty: no text found ({skipped} binary files)")
    if not val:
        raise ValueError(
            f"corpus {source} is too small to hold out a validation split "
            f"({len(train)} bytes; the last 5% of each file is held out)"
        )
    log.info(
        "corpus %s: %d files (%d binary skipped), %d train + %d val bytes",
        source,
        used,
        skipped,
        len(train),
        len(val),
    )
    return Corpus(
        train=torch.frombuffer(train, dtype=torch.uint8),
        val=torch.frombuffer(val, dtype=torch.uint8),
        vocab_size=ByteTokenizer.vocab_size,
        source=f"{source}: {used} files",
    )


def _memmap_tokens(path: Path, dtype: str) -> np.ndarray:
    size, width = path.stat().st_size, np.dtype(dtype).itemsize
    if size == 0:
        raise ValueError(f"token shard {path} is empty")
    if size % width:
        raise ValueError(f"token shard {path} has {size} bytes: not a whole number of {dtype}")
    # Copy-on-write mode: the file is never modified, and torch gets a writable array
    # (a read-only one makes torch.from_numpy warn).
    return np.memmap(path, dtype=f"<u{width}", mode="c")


def _bin_corpus(train_path: Path, val_path: Path | None) -> Corpus:
    meta = train_path.parent / "meta.json"
    vocab, dtype = _read_meta(meta) if meta.is_file() else (None, "uint16")
    tokens = _memmap_tokens(train_path, dtype)
    if val_path is None:
        cut = len(tokens) - len(tokens) // VAL_FRACTION_DENOMINATOR
        train, val = tokens[:cut], tokens[cut:]
    else:
        train, val = tokens, _memmap_tokens(val_path, dtype)
    if len(val) == 0:
        raise ValueError(f"token shard {train_path} is too small to hold out a validation split")
    if vocab is not None:
        vocab_size = vocab
    else:
        # numpy, not torch: torch implements few reductions for uint16.
        largest = max(int(train.max()), int(val.max()))
        vocab_size = -(-(largest + 1) // 64) * 64
    source = f"{train_path}" + (f" + {val_path}" if val_path else "")
    log.info(
        "corpus %s: %d train + %d val tokens, vocab %d", source, len(train), len(val), vocab_size
    )
    tokenizer = train_path.parent / "tokenizer.json"  # gaslocd tokenize puts it there
    return Corpus(
        train=torch.from_numpy(train),
        val=torch.from_numpy(val),
        vocab_size=vocab_size,
        source=source,
        tokenizer_json=tokenizer.read_text() if tokenizer.is_file() else None,
    )


def _read_meta(meta: Path) -> tuple[int, str]:
    """``vocab_size`` and the shards' ``dtype`` (uint16 unless it says uint32)."""
    try:
        obj: Any = json.loads(meta.read_text())
        value, dtype = obj["vocab_size"], obj.get("dtype", "uint16")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{meta} must be JSON with an integer 'vocab_size': {exc}") from exc
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{meta}: vocab_size must be an integer >= 1, got {value!r}")
    if dtype not in ("uint16", "uint32"):
        raise ValueError(f"{meta}: dtype must be uint16 or uint32, got {dtype!r}")
    if dtype == "uint16" and value > 2**16:
        raise ValueError(f"{meta}: a vocabulary of {value} needs dtype uint32 shards")
    return value, dtype


def _stream_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``, the same in every process (unlike ``hash()``)."""
    text = "\0".join(str(p) for p in ("gaslocd-data", *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def _check_tokens(tokens: torch.Tensor, batch_size: int, seq_len: int) -> None:
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    if len(tokens) < seq_len + 1:
        raise ValueError(
            f"{len(tokens)} tokens are fewer than one sequence: a window of seq_len {seq_len} "
            f"needs {seq_len + 1} (inputs plus the next-token targets)"
        )


def _windows(
    tokens: torch.Tensor, starts: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs tokens[i:i+T] and targets tokens[i+1:i+T+1] for each start i, as int64."""
    # Slice then widen each row: fancy indexing is not implemented for uint16 tensors.
    rows = torch.stack([tokens[i : i + seq_len + 1].long() for i in starts.tolist()])  # (B, T+1)
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()  # (B, T) each


class BatchSampler:
    """Random training windows from a stream that is a pure function of (seed, worker).

    Windows are drawn with replacement at uniformly random offsets: there is no epoch to
    track, and workers need not coordinate which data each one reads.
    """

    def __init__(
        self, tokens: torch.Tensor, *, batch_size: int, seq_len: int, seed: int, worker: int
    ) -> None:
        _check_tokens(tokens, batch_size, seq_len)
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.worker = worker
        self.batches_drawn = 0
        self._generator = torch.Generator().manual_seed(_stream_seed("train", seed, worker))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) int64."""
        high = len(self.tokens) - self.seq_len  # last start leaves room for one more target
        starts = torch.randint(0, high, (self.batch_size,), generator=self._generator)
        self.batches_drawn += 1
        return _windows(self.tokens, starts, self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        """The stream position (generator state included): enough to resume exactly."""
        return {
            "seed": self.seed,
            "worker": self.worker,
            "batches_drawn": self.batches_drawn,
            "rng_state": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; refuses the position of another stream."""
        if (state["seed"], state["worker"]) != (self.seed, self.worker):
            raise ValueError(
                f"sampler state is for seed {state['seed']} worker {state['worker']}, "
                f"not seed {self.seed} worker {self.worker}"
            )
        self._generator.set_state(state["rng_state"])
        self.batches_drawn = int(state["batches_drawn"])


def fixed_batches(
    tokens: torch.Tensor, *, batch_size: int, seq_len: int, n: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` evaluation batches, identical on every worker with the same seed.

    Every worker evaluates on the same windows, so their losses are comparable and the
    spread across workers measures the models, not the sampling.
    """
    _check_tokens(tokens, batch_size, seq_len)
    if n < 1:
        raise ValueError(f"number of evaluation batches must be >= 1, got {n}")
    generator = torch.Generator().manual_seed(_stream_seed("eval", seed))
    high = len(tokens) - seq_len
    return [
        _windows(tokens, torch.randint(0, high, (batch_size,), generator=generator), seq_len)
        for _ in range(n)
    ]


def held_out_batches(corpus: Corpus, train: TrainConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The validation batches every worker of a run evaluates on (same seed: same batches)."""
    return fixed_batches(
        corpus.val,
        batch_size=train.batch_size,
        seq_len=train.seq_len,
        n=train.eval_batches,
        seed=train.seed,
    )

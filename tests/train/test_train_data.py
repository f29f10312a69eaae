"""Corpora, the held-out split, and deterministic per-worker batch streams."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gaslocd.train.data import (
    BatchSampler,
    ByteTokenizer,
    Corpus,
    fixed_batches,
    load_corpus,
)


def _text(n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return "".join(chr(c) for c in rng.integers(97, 123, n))


def test_byte_tokenizer_round_trips_unicode() -> None:
    tok = ByteTokenizer()
    tokens = tok.encode("héllo, wörld")
    assert tokens.dtype == torch.uint8 and tok.vocab_size == 256
    assert tok.decode(tokens) == "héllo, wörld"


def test_builtin_corpus_is_the_stdlib_and_deterministic() -> None:
    a = load_corpus(None, max_bytes=200_000)
    b = load_corpus(None, max_bytes=200_000)
    assert a.vocab_size == 256 and "stdlib" in a.source
    assert len(a.train) + len(a.val) == 200_000
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert b"import" in bytes(a.train[:50_000].tolist())


def test_text_file_split_holds_out_the_last_5_percent(tmp_path: Path) -> None:
    text = _text(1000)
    (tmp_path / "a.txt").write_text(text)
    corpus = load_corpus(str(tmp_path / "a.txt"))
    assert bytes(corpus.train.tolist()).decode() == text[:950]
    assert bytes(corpus.val.tolist()).decode() == text[950:]


def test_folder_is_read_sorted_recursively_skipping_binaries_and_hidden(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "b" / "z.md").write_text("B" * 40)
    (tmp_path / "a.txt").write_text("A" * 40)
    (tmp_path / "image.png").write_bytes(b"\x89PNG\0\0binary")
    (tmp_path / ".git" / "HEAD").write_text("H" * 40)
    corpus = load_corpus(str(tmp_path))
    assert bytes(corpus.train.tolist()) == b"A" * 38 + b"B" * 38
    assert bytes(corpus.val.tolist()) == b"AABB"
    assert corpus.train.dtype == torch.uint8


def test_a_text_corpus_is_never_cut_and_too_large_a_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(_text(1000))
    (tmp_path / "b.txt").write_text(_text(1000, seed=1))
    corpus = load_corpus(str(tmp_path), max_bytes=1500)  # caps only the built-in corpus
    assert len(corpus.train) + len(corpus.val) == 2000
    with pytest.raises(ValueError, match=r"0\.0 MiB.*gaslocd tokenize"):
        load_corpus(str(tmp_path), text_limit=1999)


def test_the_builtin_corpus_is_capped(tmp_path: Path) -> None:
    corpus = load_corpus(None, max_bytes=1500)
    assert len(corpus.train) + len(corpus.val) == 1500


def test_uint32_shards_with_their_meta(tmp_path: Path) -> None:
    tokens = (np.arange(4000, dtype="<u4") * 37) % 100_000
    tokens.tofile(tmp_path / "train.bin")
    tokens[:500].tofile(tmp_path / "val.bin")
    (tmp_path / "meta.json").write_text('{"vocab_size": 100000, "dtype": "uint32"}')
    corpus = load_corpus(str(tmp_path))
    assert corpus.vocab_size == 100_000 and len(corpus.train) == 4000
    assert int(corpus.train[-1]) == int(tokens[-1])  # read as uint32, not two uint16
    x, y = BatchSampler(corpus.train, batch_size=2, seq_len=8, seed=0, worker=0).next_batch()
    assert int(x.max()) < 100_000 and torch.equal(x[:, 1:], y[:, :-1])
    (tmp_path / "meta.json").write_text('{"vocab_size": 100000}')
    with pytest.raises(ValueError, match="needs dtype uint32"):
        load_corpus(str(tmp_path))


def test_single_bin_shard(tmp_path: Path) -> None:
    tokens = np.arange(2000, dtype="<u2") % 1000
    tokens.tofile(tmp_path / "data.bin")
    corpus = load_corpus(str(tmp_path / "data.bin"))
    assert corpus.vocab_size == 1024  # 999 + 1 rounded up to a multiple of 64
    assert corpus.train.dtype == torch.uint16
    assert len(corpus.train) == 1900 and len(corpus.val) == 100
    assert corpus.val[0].item() == 1900 % 1000
    x, y = BatchSampler(corpus.train, batch_size=2, seq_len=8, seed=0, worker=0).next_batch()
    assert x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])


def test_bin_folder_with_train_val_and_meta(tmp_path: Path) -> None:
    (np.arange(500, dtype="<u2")).tofile(tmp_path / "train.bin")
    (np.arange(100, dtype="<u2")).tofile(tmp_path / "val.bin")
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 50257}))
    corpus = load_corpus(str(tmp_path))
    assert corpus.vocab_size == 50257
    assert len(corpus.train) == 500 and len(corpus.val) == 100
    assert (tmp_path / "train.bin").stat().st_size == 1000  # memmap never writes back


def test_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_corpus(str(missing))


def test_empty_corpora_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(tmp_path / "empty.bin"))
    folder = tmp_path / "f"
    folder.mkdir()
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(folder))
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(ValueError, match="validation"):
        load_corpus(str(tmp_path / "short.txt"))


def test_fewer_tokens_than_one_sequence_is_refused() -> None:
    tokens = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="fewer than one sequence"):
        BatchSampler(tokens, batch_size=2, seq_len=10, seed=0, worker=0)
    with pytest.raises(ValueError, match="fewer than one sequence"):
        fixed_batches(tokens, batch_size=2, seq_len=10, n=1, seed=0)
    BatchSampler(tokens, batch_size=2, seq_len=9, seed=0, worker=0).next_batch()


def _corpus() -> Corpus:
    return Corpus(
        train=torch.arange(5000) % 256, val=torch.arange(500) % 256, vocab_size=256, source="t"
    )


def _sampler(seed: int = 0, worker: int = 0) -> BatchSampler:
    return BatchSampler(_corpus().train, batch_size=4, seq_len=16, seed=seed, worker=worker)


def test_batches_are_shifted_windows() -> None:
    x, y = _sampler().next_batch()
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(y, (x + 1) % 256)


def test_streams_are_determined_by_seed_and_worker() -> None:
    a = [_sampler(0, 0).next_batch()[0] for _ in range(1)]
    b = [_sampler(0, 0).next_batch()[0] for _ in range(1)]
    assert torch.equal(a[0], b[0])
    assert not torch.equal(_sampler(0, 1).next_batch()[0], a[0])
    assert not torch.equal(_sampler(1, 0).next_batch()[0], a[0])


def test_resume_continues_exactly() -> None:
    straight = _sampler()
    expected = [straight.next_batch() for _ in range(10)]
    first = _sampler()
    got = [first.next_batch() for _ in range(5)]
    state = first.state_dict()
    first.next_batch()  # the state is a snapshot, not a live reference
    resumed = _sampler()
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(5)]
    for (ex, ey), (gx, gy) in zip(expected, got, strict=True):
        assert torch.equal(ex, gx) and torch.equal(ey, gy)
    assert resumed.batches_drawn == 10


def test_state_of_another_stream_is_refused() -> None:
    with pytest.raises(ValueError, match="worker 1"):
        _sampler(0, 0).load_state_dict(_sampler(0, 1).state_dict())


def test_fixed_batches_are_the_same_for_everyone() -> None:
    val = _corpus().val
    a = fixed_batches(val, batch_size=3, seq_len=8, n=4, seed=0)
    b = fixed_batches(val, batch_size=3, seq_len=8, n=4, seed=0)
    assert len(a) == 4
    for (ax, ay), (bx, by) in zip(a, b, strict=True):
        assert torch.equal(ax, bx) and torch.equal(ay, by) and ax.shape == (3, 8)
    c = fixed_batches(val, batch_size=3, seq_len=8, n=4, seed=1)
    assert not torch.equal(a[0][0], c[0][0])

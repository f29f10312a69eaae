"""A researcher's own data and model: documents tokenized with their own tokenizers file
into memory-mapped shards, and a Hugging Face-style model given as a factory file,
trained by `gaslocd simulate` with the daemon's round. Everything is built locally (no
hub): the tokenizer is trained here on the test's own text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gaslocd.cli import main
from gaslocd.train.data import load_corpus
from gaslocd.train.model import build_model, model_loss
from tests.daemon.procs import FAST_FLAGS, Daemon

tokenizers = pytest.importorskip("tokenizers", reason="pip install .[data]")
pyarrow = pytest.importorskip("pyarrow", reason="pip install .[data]")
pyarrow_parquet = pytest.importorskip("pyarrow.parquet", reason="pip install .[data]")

EOS = "<|endoftext|>"
HF_FACTORY = """
from transformers import LlamaConfig, LlamaForCausalLM

def make(*, vocab_size, seq_len):
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=seq_len,
    ))
"""


def _docs(n: int) -> list[str]:
    words = ["gossip", "local", "steps", "outer", "momentum", "peer", "round", "ring", "loss"]
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(words, size=40 + i % 7)) + f" doc{i}." for i in range(n)]


def _tokenizer(path: Path, texts: list[str]) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", EOS])
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return tok


@pytest.fixture
def shards(tmp_path: Path) -> tuple[Path, list[str], tokenizers.Tokenizer]:
    docs = _docs(60)
    tok = _tokenizer(tmp_path / "tokenizer.json", docs)
    src = tmp_path / "docs"
    src.mkdir()
    with open(src / "a.jsonl", "w") as f:  # 40 documents as JSON lines, 20 as Parquet
        for doc in docs[:40]:
            f.write(json.dumps({"text": doc, "id": 1}) + "\n")
    pyarrow_parquet.write_table(pyarrow.table({"text": docs[40:]}), str(src / "b.parquet"))
    out = tmp_path / "shards"
    argv = ["tokenize", str(src), "--tokenizer", str(tmp_path / "tokenizer.json")]
    assert main([*argv, "--out", str(out)]) == 0
    return out, docs, tok


def test_documents_become_shards_that_decode_back(
    shards: tuple[Path, list[str], tokenizers.Tokenizer],
) -> None:
    out, docs, tok = shards
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["documents"] == 60
    corpus = load_corpus(str(out))
    assert corpus.vocab_size == tok.get_vocab_size()
    eos = tok.token_to_id(EOS)
    train = corpus.train.long().tolist()
    split = [i for i, t in enumerate(train) if t == eos]
    assert len(split) == 57  # every 20th document is held out: 3 of 60
    first = tok.decode(train[: split[0]])
    assert first.split() == tok.decode(tok.encode(docs[0]).ids).split()
    val_docs = tok.decode(corpus.val.long().tolist(), skip_special_tokens=True)
    assert "doc19" in val_docs and "doc0 " not in val_docs  # whole documents, never both


def test_bad_tokenize_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.jsonl").write_text('{"body": "no text field"}\n')
    _tokenizer(tmp_path / "t.json", ["a b c"])
    argv = ["tokenize", str(tmp_path / "d.jsonl"), "--tokenizer", str(tmp_path / "t.json")]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "no string field 'text'" in capsys.readouterr().err
    assert not list((tmp_path / "o").glob("*.bin"))  # nothing that looks whole is left


@pytest.mark.slow
def test_a_hugging_face_model_from_a_file_trains_on_the_shards(
    shards: tuple[Path, list[str], tokenizers.Tokenizer], tmp_path: Path
) -> None:
    pytest.importorskip("transformers", reason="pip install .[test]")
    out, _, tok = shards
    factory = tmp_path / "hfmodel.py"
    factory.write_text(HF_FACTORY)
    spec = f"{factory}:make"
    model = build_model(spec, vocab_size=tok.get_vocab_size(), seq_len=32, seed=0)
    corpus = load_corpus(str(out))
    x = corpus.train[:33].long().reshape(1, 33)
    assert model_loss(model, x[:, :-1], x[:, 1:]).item() > 0  # the HF forward is adapted
    summary = tmp_path / "run.json"
    argv = ["simulate", "--model", spec, "--data", str(out), "--seq-len", "32"]
    argv += ["--workers", "2", "--rounds", "3", "--inner-steps", "4", "--json", str(summary)]
    assert main(argv) == 0
    result = json.loads(summary.read_text())
    losses = [p["val_loss"] for p in result["val_loss_curve"]]
    assert losses[-1] < losses[0]  # it learned from the shards


def test_a_daemon_on_shards_exports_a_model_and_tokenizer_transformers_load(
    shards: tuple[Path, list[str], tokenizers.Tokenizer],
    tmp_path: Path,
    reaper: list[subprocess.Popen[bytes]],
) -> None:
    """A real daemon trains on the shards; its checkpoint carries the shards' tokenizer,
    and `gaslocd export --format hf` writes it where AutoTokenizer finds it."""
    transformers = pytest.importorskip("transformers", reason="pip install .[test]")
    out, docs, tok = shards
    assert (out / "tokenizer.json").is_file()  # the shards folder carries its tokenizer
    ck = tmp_path / "ck"
    args = ["start", *FAST_FLAGS, "--data", str(out), "--max-rounds", "2"]
    daemon = Daemon([*args, "--checkpoint-dir", str(ck)], reaper, "shards")
    assert daemon.finish(240) == 0, daemon.output()
    hf = tmp_path / "hf"
    assert main(["export", str(ck), "--out", str(hf), "--format", "hf"]) == 0
    loaded = transformers.AutoTokenizer.from_pretrained(str(hf))
    assert loaded.encode(docs[3], add_special_tokens=False) == tok.encode(docs[3]).ids
    assert loaded.eos_token == EOS
    model = transformers.LlamaForCausalLM.from_pretrained(str(hf))
    assert model.config.vocab_size == tok.get_vocab_size()
    plain = tmp_path / "plain"  # the safetensors format gets the tokenizer file too
    assert main(["export", str(ck), "--out", str(plain)]) == 0
    assert (plain / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()


def test_a_dataset_by_name_is_streamed_and_an_unreachable_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hf:NAME goes to datasets.load_dataset(NAME, streaming=True): a dataset folder here
    (a hub name resolves the same way online); offline, a hub name fails with one line."""
    docs = _docs(60)
    folder = tmp_path / "dataset"
    folder.mkdir()
    for split, part in (("train", docs), ("test", docs[:25])):
        rows = "".join(json.dumps({"body": d}) + "\n" for d in part)
        (folder / f"{split}.jsonl").write_text(rows)
    tok = _tokenizer(tmp_path / "tok.json", docs)
    argv = ["tokenize", f"hf:{folder}", "--tokenizer", str(tmp_path / "tok.json")]
    argv += ["--text-field", "body"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0  # the train split
    assert json.loads((tmp_path / "a" / "meta.json").read_text())["documents"] == 60
    assert main([*argv, "--split", "test", "--out", str(tmp_path / "b")]) == 0
    corpus = load_corpus(str(tmp_path / "b"))
    words = tok.decode(corpus.train.long().tolist() + corpus.val.long().tolist()).split()
    assert "doc24" in words and "doc30" not in words  # the test split's 25 documents only
    offline = subprocess.run(
        [
            *(sys.executable, "-m", "gaslocd", "tokenize", "hf:nobody/no-such-dataset"),
            *("--tokenizer", str(tmp_path / "tok.json"), "--out", str(tmp_path / "c")),
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert offline.returncode == 2
    errors = [line for line in offline.stderr.splitlines() if line.startswith("gaslocd:")]
    assert errors == [errors[0]] and "cannot tokenize hf:nobody/no-such-dataset" in errors[0]
    assert not list((tmp_path / "c").glob("*.bin"))

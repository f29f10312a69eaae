"""Checkpoints: round trip into a resumed run, atomic replacement, and refusing bad files."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from gaslocd.config import TrainConfig
from gaslocd.train import checkpoint
from gaslocd.train.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    build_payload,
    load_checkpoint,
    load_newest,
    older_copies,
    save_checkpoint,
)
from gaslocd.train.data import BatchSampler
from gaslocd.train.flat import FlatParameters, model_fingerprint
from gaslocd.train.inner import InnerTrainer
from gaslocd.train.model import build_model

CFG = TrainConfig(seq_len=16, batch_size=2, warmup_steps=2)


def _trainer() -> InnerTrainer:
    model = build_model("tiny", vocab_size=256, seq_len=16, seed=0)
    sampler = BatchSampler(torch.arange(1000) % 251, batch_size=2, seq_len=16, seed=0, worker=3)
    return InnerTrainer(model, FlatParameters(model), sampler, CFG)


def _payload(fingerprint: str = "abc", round: int = 1) -> dict[str, Any]:
    return build_payload(
        fingerprint=fingerprint,
        round=round,
        theta=torch.arange(5.0),
        outer_momentum=torch.zeros(5),
        inner={"steps_done": 0},
        extra={"run_id": "r"},
    )


def test_round_trip_resumes_training_exactly(tmp_path: Path) -> None:
    a = _trainer()
    a.train_steps(3)
    fp = model_fingerprint(a.model, "tiny")
    momentum = torch.randn(a.flat.numel)
    payload = build_payload(
        fingerprint=fp,
        round=7,
        theta=a.flat.flat,
        outer_momentum=momentum,
        inner=a.state_dict(),
        extra={"run_id": "run-1", "losses": [1.5, 1.25]},
    )
    save_checkpoint(tmp_path / "ckpt.pt", payload)
    expected = a.train_steps(3)

    loaded = load_checkpoint(tmp_path / "ckpt.pt", expected_fingerprint=fp)
    assert loaded["format_version"] == FORMAT_VERSION and loaded["round"] == 7
    assert loaded["extra"] == {"run_id": "run-1", "losses": [1.5, 1.25]}
    assert torch.equal(loaded["outer_momentum"], momentum)
    b = _trainer()
    b.flat.load_(loaded["theta"])
    b.load_state_dict(loaded["inner"])
    assert b.train_steps(3) == expected
    assert torch.equal(a.flat.flat, b.flat.flat)


def test_wrong_fingerprint_names_both(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "c.pt", _payload("aaaa"))
    with pytest.raises(CheckpointError, match=r"different model.*'aaaa'.*'bbbb'"):
        load_checkpoint(tmp_path / "c.pt", expected_fingerprint="bbbb")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nothere\.pt"):
        load_checkpoint(tmp_path / "nothere.pt", expected_fingerprint="abc")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_files_are_checkpoint_errors(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, _payload())
    data = path.read_bytes()
    path.write_bytes(
        {"truncate": data[: len(data) // 2], "garbage": os.urandom(300), "empty": b""}[damage]
    )
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path, expected_fingerprint="abc")


class Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo should never run",))


def test_arbitrary_objects_are_never_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format_version": FORMAT_VERSION, "fingerprint": "abc", "x": Evil()}, path)
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path, expected_fingerprint="abc")


def test_unknown_format_and_non_dict_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"format_version": 99, "fingerprint": "abc"}, path)
    with pytest.raises(CheckpointError, match="format_version 99"):
        load_checkpoint(path, expected_fingerprint="abc")
    torch.save([1, 2], path)
    with pytest.raises(CheckpointError, match="not a dict"):
        load_checkpoint(path, expected_fingerprint="abc")


def test_failure_mid_write_leaves_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, _payload(round=1))

    def crash_halfway(obj: object, f: io.BufferedWriter) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", crash_halfway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, _payload(round=2))
    monkeypatch.undo()
    assert load_checkpoint(path, expected_fingerprint="abc")["round"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]  # no temp file left


def test_unsafe_payloads_are_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, _payload(round=1))
    bad = _payload(round=2)
    bad["extra"]["callback"] = print
    with pytest.raises(TypeError, match=r"payload\.extra\.callback"):
        save_checkpoint(path, bad)
    with pytest.raises(ValueError, match="fingerprint"):
        save_checkpoint(path, {"format_version": FORMAT_VERSION})
    assert load_checkpoint(path, expected_fingerprint="abc")["round"] == 1


def test_save_creates_the_directory_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "c.pt"
    save_checkpoint(path, _payload(round=1))
    save_checkpoint(path, _payload(round=2))
    assert load_checkpoint(path, expected_fingerprint="abc")["round"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["c.pt"]


def test_older_checkpoints_are_kept_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    for round_ in range(1, 5):
        save_checkpoint(path, _payload("fp", round_), keep=3)
    kept = [load_checkpoint(p, expected_fingerprint="fp")["round"] for p in older_copies(path, 3)]
    assert kept == [4, 3, 2]
    assert not path.with_name("checkpoint.pt.3").exists()


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    for round_ in (1, 2):
        save_checkpoint(path, _payload("fp", round_), keep=2)
    path.write_bytes(path.read_bytes()[:100])  # a disk error after the write
    payload, used = load_newest(path, keep=2, expected_fingerprint="fp")
    assert (payload["round"], used.name) == (1, "checkpoint.pt.1")
    with pytest.raises(CheckpointError, match="different model"):  # never skipped
        load_newest(path.with_name("checkpoint.pt.1"), keep=1, expected_fingerprint="other")

"""`gaslocd export`: a checkpoint's model comes out as safetensors with our names, or as a
Llama that transformers loads and that computes the same logits; a checkpoint that does
not match its recorded spec is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gaslocd.cli import main
from gaslocd.train.checkpoint import CheckpointError, build_payload, save_checkpoint
from gaslocd.train.export import SPEC_KEY, ModelSpec, export_checkpoint, load_trained_model
from gaslocd.train.flat import FlatParameters, model_fingerprint
from gaslocd.train.model import build_model

safetensors_torch = pytest.importorskip("safetensors.torch", reason="pip install .[export]")


def _trained(tmp_path: Path, spec: ModelSpec, *, record_spec: bool = True) -> torch.nn.Module:
    """A model with θ moved away from its init, saved as a daemon saves it."""
    model = build_model(spec.model, vocab_size=spec.vocab_size, seq_len=spec.seq_len, seed=3)
    flat = FlatParameters(model)
    flat.flat.add_(0.01 * torch.randn(flat.numel, generator=torch.Generator().manual_seed(1)))
    extra = {"run_id": "r", SPEC_KEY: spec.to_extra()} if record_spec else {"run_id": "r"}
    payload = build_payload(
        fingerprint=model_fingerprint(model, spec.model),
        round=7,
        theta=flat.flat.clone(),
        outer_momentum=torch.zeros(flat.numel),
        inner={},
        extra=extra,
    )
    save_checkpoint(tmp_path / "ck" / "checkpoint.pt", payload)
    return model


def test_safetensors_hold_the_checkpoints_parameters(tmp_path: Path) -> None:
    model = _trained(tmp_path, ModelSpec("tiny", 256, 64))
    files = export_checkpoint(tmp_path / "ck", tmp_path / "out")
    assert {f.name for f in files} == {"model.safetensors", "gaslocd_model.json"}
    saved = safetensors_torch.load_file(str(tmp_path / "out" / "model.safetensors"))
    expected = dict(model.named_parameters())
    assert saved.keys() == expected.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name].detach()), name


def test_a_builtin_model_loads_in_transformers_with_the_same_logits(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="pip install .[test]")
    model = _trained(tmp_path, ModelSpec("tiny", 256, 64))
    assert (
        main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    )
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _ = model(tokens)
        theirs = hf(input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


def test_a_checkpoint_without_a_spec_or_of_another_model_is_refused(tmp_path: Path) -> None:
    _trained(tmp_path, ModelSpec("tiny", 256, 64), record_spec=False)
    with pytest.raises(CheckpointError, match="no model spec"):
        load_trained_model(tmp_path / "ck")
    _trained(tmp_path, ModelSpec("tiny", 256, 64))
    payload = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    payload["extra"][SPEC_KEY]["model"] = "small"  # the spec no longer matches θ
    save_checkpoint(tmp_path / "ck" / "checkpoint.pt", payload)
    with pytest.raises(CheckpointError, match="different model"):
        load_trained_model(tmp_path / "ck")
    assert not (tmp_path / "out").exists()


def test_bad_export_arguments_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing")]) == 2
    assert "--out" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()

"""Getting a trained model out of a checkpoint: safetensors, and a Llama ``transformers`` loads.

A checkpoint holds one flat θ vector, which only a model of the same layout can read.
Since checkpoints record their model spec (``extra["model_spec"]``: the model name or
factory, the sequence length and the vocabulary size), :func:`export_checkpoint` can
rebuild that model, check the checkpoint's fingerprint against it (a spec that does not
match the vector is refused, never silently reshaped), pour θ into it and write:

- ``safetensors``: the model's own ``state_dict`` names (tied weights once), for any
  model, built-in or factory, plus ``gaslocd_model.json`` with the spec;
- ``hf``: the built-in Llama in the layout of ``transformers``' ``LlamaForCausalLM``
  (``config.json`` and ``model.safetensors``). Our blocks are that architecture: RMSNorm
  pre-norm, RoPE in the "rotate half" layout, SwiGLU, tied embeddings, no biases; only
  the fused ``wqkv`` is split into q, k and v.

A run on shards from ``gaslocd tokenize`` records their tokenizer in its checkpoints, and
the export writes it beside the weights (with the ``hf`` format, so that
``AutoTokenizer.from_pretrained`` loads it too). A run on bytes has no tokenizer file:
token = byte value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gaslocd.train.checkpoint import CheckpointError, load_checkpoint
from gaslocd.train.flat import FlatParameters, model_fingerprint
from gaslocd.train.model import MODEL_CONFIGS, Block, Llama, build_model
from gaslocd.train.shards import EOS_NAMES

FORMATS = ("safetensors", "hf")
SPEC_KEY = "model_spec"
TOKENIZER_KEY = "tokenizer_json"  # the shards' tokenizers file, as text


@dataclass(frozen=True)
class ModelSpec:
    """What rebuilds a checkpoint's model: :func:`build_model`'s arguments."""

    model: str
    vocab_size: int
    seq_len: int

    def to_extra(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_extra(cls, extra: object) -> ModelSpec:
        if not isinstance(extra, dict) or not isinstance(extra.get(SPEC_KEY), dict):
            raise CheckpointError(
                "the checkpoint records no model spec (it was written before checkpoints "
                "did): resume the run with this gaslocd and let it write a new checkpoint"
            )
        spec = extra[SPEC_KEY]
        try:
            return cls(str(spec["model"]), int(spec["vocab_size"]), int(spec["seq_len"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"the checkpoint's model spec is malformed: {spec!r}") from exc


def _checkpoint_file(path: Path) -> Path:
    return path / "checkpoint.pt" if path.is_dir() else path


def load_trained_model(path: Path) -> tuple[nn.Module, ModelSpec, dict[str, Any]]:
    """The checkpoint's model with θ loaded (on CPU, float32), its spec, and the payload.

    The checkpoint is read twice: once without a fingerprint check to learn the spec, then
    checked against the model that spec builds.
    """
    file = _checkpoint_file(Path(path))
    try:
        raw = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {file}") from None
    except Exception as exc:  # damaged file: load_checkpoint below names it properly
        raise CheckpointError(f"checkpoint {file} cannot be read: {exc}") from exc
    spec = ModelSpec.from_extra(raw.get("extra") if isinstance(raw, dict) else None)
    model = build_model(spec.model, vocab_size=spec.vocab_size, seq_len=spec.seq_len, seed=0)
    flat = FlatParameters(model)
    payload = load_checkpoint(file, expected_fingerprint=model_fingerprint(model, spec.model))
    theta = payload["theta"].to(torch.float32).reshape(-1)
    if theta.numel() != flat.numel or not torch.isfinite(theta).all():
        raise CheckpointError(f"checkpoint {file}: θ is not {flat.numel} finite values")
    flat.load_(theta)
    return model, spec, payload


def hf_llama_tensors(model: Llama) -> dict[str, torch.Tensor]:
    """Our Llama's parameters under ``LlamaForCausalLM``'s names (contiguous copies)."""
    c = model.cfg.dim
    out = {
        "model.embed_tokens.weight": model.tok_emb.weight,
        "model.norm.weight": model.norm.weight,
    }
    for i, block in enumerate(model.blocks):
        assert isinstance(block, Block)
        pre = f"model.layers.{i}"
        q, k, v = block.attn.wqkv.weight.split(c, dim=0)
        out |= {
            f"{pre}.self_attn.q_proj.weight": q,
            f"{pre}.self_attn.k_proj.weight": k,
            f"{pre}.self_attn.v_proj.weight": v,
            f"{pre}.self_attn.o_proj.weight": block.attn.wo.weight,
            f"{pre}.mlp.gate_proj.weight": block.mlp.w1.weight,
            f"{pre}.mlp.up_proj.weight": block.mlp.w3.weight,
            f"{pre}.mlp.down_proj.weight": block.mlp.w2.weight,
            f"{pre}.input_layernorm.weight": block.attn_norm.weight,
            f"{pre}.post_attention_layernorm.weight": block.mlp_norm.weight,
        }
    return {name: t.detach().contiguous().clone() for name, t in out.items()}


def hf_llama_config(model: Llama) -> dict[str, Any]:
    """``config.json`` for ``LlamaForCausalLM`` with our shape (one KV head per head)."""
    cfg = model.cfg
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def export_checkpoint(path: Path, out: Path, fmt: str = "safetensors") -> list[Path]:
    """Write the checkpoint's model to the folder ``out``; returns the files written."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    from safetensors.torch import save_file  # an optional dependency: only export needs it

    model, spec, payload = load_trained_model(path)
    out.mkdir(parents=True, exist_ok=True)
    meta = {**spec.to_extra(), "round": int(payload["round"]), "format": fmt}
    if fmt == "hf":
        if spec.model not in MODEL_CONFIGS or not isinstance(model, Llama):
            raise ValueError(
                f"--format hf needs a built-in model ({', '.join(MODEL_CONFIGS)}), not "
                f"{spec.model!r}: export it as safetensors"
            )
        weights = out / "model.safetensors"
        save_file(hf_llama_tensors(model), str(weights), metadata={"format": "pt"})
        config = out / "config.json"
        config.write_text(json.dumps(hf_llama_config(model), indent=1) + "\n")
        return [weights, config, *_write_tokenizer(payload, out, hf=True)]
    # state_dict() lists tied weights twice; safetensors refuses shared storage.
    unique = {name: p.detach().contiguous().clone() for name, p in model.named_parameters()}
    weights = out / "model.safetensors"
    save_file(unique, str(weights), metadata={k: str(v) for k, v in meta.items()})
    spec_file = out / "gaslocd_model.json"
    spec_file.write_text(json.dumps(meta, indent=1) + "\n")
    return [weights, spec_file, *_write_tokenizer(payload, out, hf=False)]


def _write_tokenizer(payload: dict[str, Any], out: Path, hf: bool) -> list[Path]:
    """The run's tokenizer beside the weights (``tokenizer.json``; for ``hf`` also the
    ``tokenizer_config.json`` that makes ``AutoTokenizer`` load it). None recorded: the
    run trained on bytes (or on shards tokenized elsewhere), nothing is written."""
    text = payload.get("extra", {}).get(TOKENIZER_KEY)
    if not isinstance(text, str):
        return []
    files = [out / "tokenizer.json"]
    files[0].write_text(text)
    if hf:
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
        added = {t.get("content") for t in json.loads(text).get("added_tokens", [])}
        eos = next((name for name in EOS_NAMES if name in added), None)
        if eos is not None:
            config["eos_token"] = eos
        files.append(out / "tokenizer_config.json")
        files[1].write_text(json.dumps(config, indent=1) + "\n")
    return files

"""``gaslocd export``: a checkpoint's model as safetensors, or as a ``transformers`` Llama."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gaslocd.cli.settings import EXPORT
from gaslocd.cli.sources import Command


def run_export(command: str, resolved: dict[str, Any]) -> int:
    """Refuse a missing argument before torch loads; a bad checkpoint is one line, exit 2."""
    checkpoint, out = resolved["export_checkpoint"], resolved["export_out"]
    if checkpoint is None:
        raise ValueError("export needs the checkpoint: gaslocd export CHECKPOINT --out DIR")
    if out is None:
        raise ValueError("export needs --out DIR, the folder to write the model into")
    from gaslocd.train.checkpoint import CheckpointError
    from gaslocd.train.export import export_checkpoint

    try:
        files = export_checkpoint(Path(checkpoint), Path(out), resolved["export_format"])
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"export needs the {exc.name!r} package: pip install 'gaslocd[export]'"
        ) from None
    for file in files:
        print(f"wrote {file}")
    return 0


EXPORT_COMMAND = Command(
    EXPORT,
    help="write a checkpoint's model as safetensors or as a transformers Llama",
    description="Rebuild the model a checkpoint was trained with (its recorded spec), "
    "load θ into it and write safetensors; --format hf writes a built-in model in the "
    "layout transformers loads as LlamaForCausalLM.",
    run=run_export,
)

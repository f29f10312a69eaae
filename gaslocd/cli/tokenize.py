"""``gaslocd tokenize``: documents → memory-mapped token shards for ``--data``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gaslocd.cli.settings import TOKENIZE
from gaslocd.cli.sources import Command


def run_tokenize(command: str, resolved: dict[str, Any]) -> int:
    """Missing arguments are one line before anything is read; so is a missing package."""
    source, tokenizer, out = (
        resolved["tokenize_source"],
        resolved["tokenizer"],
        resolved["tokenize_out"],
    )
    if source is None or tokenizer is None or out is None:
        raise ValueError("usage: gaslocd tokenize DOCUMENTS --tokenizer tokenizer.json --out DIR")
    from gaslocd.train.shards import HUB_PREFIX, HubSource, tokenize_to_shards

    name = str(source)
    documents: Path | HubSource = Path(source)
    if name.startswith(HUB_PREFIX):
        documents = HubSource(name[len(HUB_PREFIX) :], resolved["split"], resolved["subset"])
    try:
        info = tokenize_to_shards(
            documents, Path(tokenizer), Path(out), text_field=resolved["text_field"]
        )
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"tokenize needs the {exc.name!r} package: pip install 'gaslocd[data]'"
        ) from None
    except (OSError, UnicodeError, KeyError) as exc:  # unreadable input, a bad row, offline
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot tokenize {source}: {first}") from None
    print(
        f"{info.documents} documents → {info.train_tokens} train + {info.val_tokens} val "
        f"tokens ({info.dtype}, vocabulary {info.vocab_size}) in {out}; train with --data {out}"
    )
    return 0


TOKENIZE_COMMAND = Command(
    TOKENIZE,
    help="tokenize documents into token shards that --data memory-maps",
    description="Stream text, JSON lines, Parquet or Arrow documents through a Hugging "
    "Face tokenizers file into train.bin/val.bin (uint16, or uint32 for large "
    "vocabularies) and meta.json; every 20th document is held out for validation.",
    run=run_tokenize,
)

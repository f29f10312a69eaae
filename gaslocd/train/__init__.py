"""Layer 3: the model, token data, the inner loop and checkpoints (no networking).

- ``model``: the Llama-style decoder, named sizes, ``build_model`` / ``count_parameters``.
- ``flat``: all parameters as views into one float32 vector; the model fingerprint.
- ``data``: byte tokenizer, corpora with a held-out split, per-worker batch streams.
- ``inner``: the inner AdamW loop whose state persists across outer rounds.
- ``checkpoint``: atomic, ``weights_only`` checkpoints checked against the fingerprint.
"""

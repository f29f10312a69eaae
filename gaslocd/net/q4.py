"""The kernels of the ``q4`` codec: blockwise absmax 4-bit, two values per byte.

Per block of ``Q4_BLOCK`` elements: ``scale = max|x| / 7`` (a float32, 4 bytes, in front of
the block's own values as for int8, so a chunk of whole blocks decodes on arrival) and
``q = round(x / scale)`` in [-7, 7] (symmetric: the code -8 is never produced and zero is
exact), stored as ``q + 8`` in a nibble, even element in the low nibble. A block of 64 is
4 + 32 bytes: 4.5 bits per value, 7.1× smaller than fp32 and 1.8× smaller than int8.
The levels are coarse (the error of one message is ≈ 6 % of ‖θ‖ on a real model against
0.6 % for int8): q4 is for links that cannot carry int8 within a round at all.

Why 64 and not 32: the relative L2 error of one encoding, measured with
``bench/codec_error.py`` (torch 2.13, one thread):

=====================================  ========  ========  ========  ========  ========
data                                   fp16      bf16      int8      q4 / 32   q4 / 64
=====================================  ========  ========  ========  ========  ========
N(0, 0.02), 4M values                  2.1e-4    1.7e-3    7.9e-3    0.097     0.108
``small`` model at init (4.9M)         1.1e-4    9.1e-4    5.3e-3    0.053     0.059
``small`` after 60 AdamW steps         2.0e-4    1.6e-3    5.8e-3    0.058     0.065
bytes per value                        2         2         1.004     0.625     0.5625
=====================================  ========  ========  ========  ========  ========

A block of 32 buys 10 % less error for 11 % more bytes: the float32 scale is a fifth of a
32-block's bytes. Half a bit more per value spent on levels instead would cut the error by
29 % (it halves per bit), so small blocks are a poor use of bytes. And q4 is only chosen
on a link too slow for int8, where bytes are what is short, while error feedback carries
the rounding error into the next rounds anyway (it telescopes). An fp16 scale would make
32-blocks as small, but its range (6e-8 to 65504) would send blocks of small values as
zeros and overflow large ones.

Speed on this (shared) CPU, one thread, the ``small`` model's 4.9M values, best of 7 in
four runs: encode ≈ 550–600 M values/s (0.5–0.7× int8), decode ≈ 850–1000 M values/s
(0.4–0.6× int8); the packing costs a few passes more than int8's single cast. At 4.5
bits per value that is > 300 MB/s of wire output per thread, far above any link slow
enough to need q4.

Non-finite input: a block holding inf or NaN gets a non-finite scale and all codes 8, so
it decodes to 0 · inf = NaN, which the receiver's finite check refuses. A block whose
absmax is below 1e-37 (7 / absmax would overflow) is sent as zeros.

Pure torch, vectorised over blocks (no Python loop per block); imports nothing of gaslocd
so that :mod:`gaslocd.net.codecs` can register it without an import cycle.
"""

from __future__ import annotations

import torch

Q4_BLOCK = 64
SCALE_BYTES = 4  # one float32 scale per block
_LEVELS = 7.0
# Two codes in one byte: (qe + 8) + 16 (qo + 8) = qe + 16 qo + 136, in 17..255.
_PACK_OFFSET = 8.0 + 16.0 * 8.0
_MIN_ABSMAX = 2 * _LEVELS / torch.finfo(torch.float32).max  # 7 / absmax stays finite


def row_bytes(block: int) -> int:
    """Encoded size of one block of ``block`` elements (a last, shorter block included)."""
    return SCALE_BYTES + (block + 1) // 2


def encode_rows(x: torch.Tensor, rows: torch.Tensor) -> None:
    """x: (blocks, b) float32 → rows: (blocks, 4 + ceil(b / 2)) uint8."""
    if x.shape[1] % 2:  # only a vector's last, partial block: pad it with one zero
        x = torch.nn.functional.pad(x, (0, 1))
    hi = x.amax(dim=1, keepdim=True)
    absmax = torch.maximum(hi, x.amin(dim=1, keepdim=True).neg_())  # (blocks, 1)
    scale = absmax / _LEVELS
    # An all-zero block gets q = 0. Below _MIN_ABSMAX, 7 / absmax would overflow: such a
    # block is sent as zeros (an error under 1e-37). inf > _MIN_ABSMAX, so an inf block
    # gets inv = 7 / inf = 0; a NaN block fails the test: inv = 0 too.
    inv = torch.where(absmax > _MIN_ABSMAX, _LEVELS / absmax, torch.zeros_like(absmax))
    # |x · inv| <= 7 by construction (no clamp pass), except the NaN of inf · 0 or NaN · 0
    # in a non-finite block: only then one more pass, which gives the block the code of
    # zero, so that it decodes to 0 · (its non-finite scale) = NaN.
    q = torch.mul(x, inv).round_()  # (blocks, b), the one float temporary
    if not bool(torch.isfinite(absmax).all()):
        q.nan_to_num_(0.0, posinf=0.0, neginf=0.0)
    pairs = q.view(q.shape[0], -1, 2)
    packed = torch.add(pairs[:, :, 0], pairs[:, :, 1], alpha=16.0).add_(_PACK_OFFSET)
    rows[:, SCALE_BYTES:].copy_(packed)  # float → uint8, exact: integers in 17..255
    rows[:, :SCALE_BYTES].copy_(scale.view(torch.uint8))


def decode_rows(rows: torch.Tensor, out: torch.Tensor) -> None:
    """rows: (blocks, 4 + ceil(b / 2)) uint8 → out: (blocks, b) float32."""
    blocks, b = out.shape
    target = out if b % 2 == 0 else torch.empty((blocks, b + 1), dtype=torch.float32)
    # Copy the scales out first: the bytes inside a row are not 4-aligned for a float view.
    scale_bytes = torch.empty((blocks, SCALE_BYTES), dtype=torch.uint8)
    scale = scale_bytes.copy_(rows[:, :SCALE_BYTES]).view(torch.float32)  # (blocks, 1)
    packed = rows[:, SCALE_BYTES:]
    pairs = target.view(blocks, -1, 2)
    pairs[:, :, 0].copy_(packed.bitwise_and(15))
    pairs[:, :, 1].copy_(packed.bitwise_right_shift(4))
    target.sub_(8.0).mul_(scale)
    if target is not out:
        out.copy_(target[:, :b])

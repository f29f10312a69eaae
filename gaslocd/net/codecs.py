"""Codecs: how a flat float32 parameter vector θ̃ becomes bytes on the wire and back.

Five codecs, chosen by name (``fp32``, ``fp16``, ``bf16``, ``int8``, ``q4``), in that
order of fidelity and of size (4, 2, 2, ≈1, ≈0.56 bytes per value). Every codec maps a
1-D float32 tensor to a 1-D uint8 tensor (the exact bytes sent) and back. Pure torch: this
module imports neither grpc nor hivemind, so the simulator's in-memory transport uses the
very same code as the gRPC wire.

Streaming. The byte layout of every codec is *block-interleaved*: element block ``k``
occupies a contiguous byte range, and a chunk of whole blocks starting at element ``s``
starts at byte ``encoded_nbytes(s)``. So a sender can encode chunk by chunk into a reused
buffer while earlier chunks are on the wire, and a receiver can decode each chunk as it
arrives straight into its preallocated float32 buffer (see :func:`chunk_spans`). For int8
that is why each block's float32 scale sits *in front of its own* 1024 int8 values instead
of all scales coming first: a scales-first layout would need the tail of the message before
the first chunk could be decoded.

int8 is blockwise absmax: per block of 1024 elements, ``scale = max|x| / 127`` and
``q = round(x / scale)`` in [-127, 127] (symmetric, so -128 is never produced and zero is
exact). 1024 keeps the scale overhead at 0.4 % (the message is 3.98× smaller than fp32)
while a block is still small enough that one large weight does not flatten its neighbours.
q4 is the same scheme at 4 bits (levels -7..7, two per byte, blocks of 64, each with its
own float32 scale in front): see :mod:`gaslocd.net.q4` for the layout and the measurements
behind the block size. It is meant for links too slow to carry int8 within a round.

Non-finite input is not refused here (the codec has no opinion about the model): fp16
overflows to inf beyond 65504, and an int8 or q4 block holding inf or NaN decodes to NaN.
The receiver's finite check refuses both, so a bad value never reaches θ silently.

Error feedback: see :class:`ErrorFeedback`, and :class:`FeedbackBank` when a sender uses
more than one codec at a time (a codec per link).
"""

from __future__ import annotations

import threading

import torch

from gaslocd.net import q4

CODEC_NAMES = ("fp32", "fp16", "bf16", "int8", "q4")
INT8_BLOCK = 1024
_SCALE_BYTES = 4  # one float32 scale per int8 block


class Codec:
    """Base class: one instance per name (see :func:`get_codec`); stateless and thread-safe.

    ``block_elems`` is the streaming alignment unit: a chunk boundary must fall on a
    multiple of it (except at the end of the vector). ``lossless`` codecs need no error
    feedback.
    """

    name: str = ""
    block_elems: int = 1
    lossless: bool = False

    def encoded_nbytes(self, numel: int) -> int:
        """Exact size in bytes of the encoding of ``numel`` elements."""
        raise NotImplementedError

    def encode_into(self, src: torch.Tensor, out: torch.Tensor) -> None:
        """Encode 1-D float32 ``src`` into the preallocated uint8 ``out`` (exact size)."""
        raise NotImplementedError

    def decode(self, data: torch.Tensor, out: torch.Tensor) -> None:
        """Decode uint8 ``data`` into the preallocated 1-D float32 ``out`` (exact sizes)."""
        raise NotImplementedError

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """Encode 1-D float32 ``src`` into a fresh uint8 tensor (never a view of ``src``)."""
        _check_float_vector(src, "src")
        out = torch.empty(self.encoded_nbytes(src.numel()), dtype=torch.uint8)
        self.encode_into(src, out)
        return out

    def _check_sizes(self, data: torch.Tensor, values: torch.Tensor, what: str) -> None:
        _check_float_vector(values, what)
        if data.dtype != torch.uint8 or data.dim() != 1:
            shape = tuple(data.shape)
            raise ValueError(f"encoded data must be a 1-D uint8 tensor, got {data.dtype} {shape}")
        want = self.encoded_nbytes(values.numel())
        if data.numel() != want:
            raise ValueError(
                f"{self.name}: {values.numel()} elements encode to {want} bytes, got {data.numel()}"
            )

    def __repr__(self) -> str:
        return f"get_codec({self.name!r})"


def _check_float_vector(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.float32 or t.dim() != 1:
        raise ValueError(f"{what} must be a 1-D float32 tensor, got {t.dtype} {tuple(t.shape)}")


class _Float(Codec):
    """fp32 / fp16 / bf16: a plain cast. The bytes are the little-endian values."""

    def __init__(self, name: str, dtype: torch.dtype, lossless: bool) -> None:
        self.name = name
        self.dtype = dtype
        self.lossless = lossless
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    def encoded_nbytes(self, numel: int) -> int:
        return numel * self.itemsize

    def encode_into(self, src: torch.Tensor, out: torch.Tensor) -> None:
        self._check_sizes(out, src, "src")
        # copy_ with a dtype change writes straight into the wire buffer: no temporary.
        out.view(self.dtype).copy_(src)

    def decode(self, data: torch.Tensor, out: torch.Tensor) -> None:
        self._check_sizes(data, out, "out")
        out.copy_(data.view(self.dtype))


class _Blockwise(Codec):
    """Blockwise absmax codecs: per block, a float32 scale, then the block's codes.

    Subclasses give the size of one encoded row and the two row kernels; full blocks are
    coded as one (blocks, row) view, a vector's last partial block as one shorter row.
    """

    lossless = False

    def __init__(self, block: int) -> None:
        self.block_elems = block

    def _row_bytes(self, elems: int) -> int:
        raise NotImplementedError

    def _encode_rows(self, x: torch.Tensor, rows: torch.Tensor) -> None:
        raise NotImplementedError

    def _decode_rows(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError

    def encoded_nbytes(self, numel: int) -> int:
        full, rem = self._split(numel)
        return full * self._row_bytes(self.block_elems) + (self._row_bytes(rem) if rem else 0)

    def _split(self, n: int) -> tuple[int, int]:
        full = n // self.block_elems
        return full, n - full * self.block_elems

    def encode_into(self, src: torch.Tensor, out: torch.Tensor) -> None:
        self._check_sizes(out, src, "src")
        b = self.block_elems
        full, rem = self._split(src.numel())
        row = self._row_bytes(b)
        if full:
            self._encode_rows(src[: full * b].view(full, b), out[: full * row].view(full, row))
        if rem:
            self._encode_rows(src[full * b :].view(1, rem), out[full * row :].view(1, -1))

    def decode(self, data: torch.Tensor, out: torch.Tensor) -> None:
        self._check_sizes(data, out, "out")
        b = self.block_elems
        full, rem = self._split(out.numel())
        row = self._row_bytes(b)
        if full:
            self._decode_rows(data[: full * row].view(full, row), out[: full * b].view(full, b))
        if rem:
            self._decode_rows(data[full * row :].view(1, -1), out[full * b :].view(1, rem))


class _Int8(_Blockwise):
    """Blockwise absmax int8; per block: 4 bytes float32 scale, then the int8 values."""

    name = "int8"

    def __init__(self, block: int = INT8_BLOCK) -> None:
        super().__init__(block)

    def _row_bytes(self, elems: int) -> int:
        return _SCALE_BYTES + elems

    def _encode_rows(self, x: torch.Tensor, rows: torch.Tensor) -> None:
        _encode_rows(x, rows)

    def _decode_rows(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        _decode_rows(rows, out)


class _Q4(_Blockwise):
    """Blockwise absmax 4-bit (:mod:`gaslocd.net.q4`): a float32 scale, then 2 codes a byte."""

    name = "q4"

    def __init__(self, block: int = q4.Q4_BLOCK) -> None:
        if block % 2:
            raise ValueError(f"a q4 block holds whole bytes: an even size, got {block}")
        super().__init__(block)

    def _row_bytes(self, elems: int) -> int:
        return q4.row_bytes(elems)

    def _encode_rows(self, x: torch.Tensor, rows: torch.Tensor) -> None:
        q4.encode_rows(x, rows)

    def _decode_rows(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        q4.decode_rows(rows, out)


def _encode_rows(x: torch.Tensor, rows: torch.Tensor) -> None:
    """x: (blocks, b) float32 → rows: (blocks, 4 + b) uint8."""
    # amax and amin, not aminmax (40× slower along a dim in torch 2.13 on CPU, measured)
    # nor |x|.amax (a full temporary): two cheap reductions.
    hi = x.amax(dim=1, keepdim=True)
    absmax = torch.maximum(hi, x.amin(dim=1, keepdim=True).neg_())  # (blocks, 1)
    scale = absmax / 127.0
    # An all-zero block gets scale 0 and q = 0; an inf block gets inv = 0 and decodes to
    # 0 * inf = NaN, which the receiver's finite check refuses.
    inv = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    # |x · inv| <= 127 by construction (no clamp pass); the int8 copy truncates the
    # already rounded values.
    q = torch.mul(x, inv).round_()  # (blocks, b), the one temporary
    rows[:, _SCALE_BYTES:].view(torch.int8).copy_(q)
    rows[:, :_SCALE_BYTES].copy_(scale.view(torch.uint8))


def _decode_rows(rows: torch.Tensor, out: torch.Tensor) -> None:
    """rows: (blocks, 4 + b) uint8 → out: (blocks, b) float32."""
    # Copy the scales out first: the bytes inside a row are not 4-aligned for a float view.
    scale_bytes = torch.empty((rows.shape[0], _SCALE_BYTES), dtype=torch.uint8)
    scale = scale_bytes.copy_(rows[:, :_SCALE_BYTES]).view(torch.float32)  # (blocks, 1)
    torch.mul(rows[:, _SCALE_BYTES:].view(torch.int8), scale, out=out)


_CODECS: dict[str, Codec] = {
    "fp32": _Float("fp32", torch.float32, lossless=True),
    "fp16": _Float("fp16", torch.float16, lossless=False),
    "bf16": _Float("bf16", torch.bfloat16, lossless=False),
    "int8": _Int8(),
    "q4": _Q4(),
}


def get_codec(name: str) -> Codec:
    """The codec called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return _CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(CODEC_NAMES)}") from None


def chunk_spans(codec: Codec, numel: int, chunk_bytes: int) -> list[tuple[int, int, int, int]]:
    """Split a message into block-aligned chunks of at most about ``chunk_bytes`` bytes.

    Returns ``(elem_start, elem_stop, byte_start, byte_stop)`` per chunk. Both sides compute
    the same spans from (codec, numel, chunk_bytes), so the receiver knows where every chunk
    belongs without trusting offsets sent by the peer. An empty vector gives no chunks.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    block = codec.block_elems
    per_block = codec.encoded_nbytes(block)
    elems = max(1, chunk_bytes // per_block) * block
    spans = []
    for start in range(0, numel, elems):
        stop = min(numel, start + elems)
        spans.append((start, stop, codec.encoded_nbytes(start), codec.encoded_nbytes(stop)))
    return spans


class ErrorFeedback:
    """Sender-side residual so that lossy codecs do not bias the network mean over rounds.

    ``encode(x)`` sends ``q = Q(x + e)`` and keeps ``e ← (x + e) − decode(q)``. Over rounds
    the error that leaves this sender is ``q_t − x_t = e_t − e_{t+1}``: it telescopes, so
    the sum of everything ever sent differs from the sum of the true θ̃ by one bounded
    residual instead of growing with the number of rounds. Without it a deterministic
    rounding (an update smaller than half an int8 step, rounded away every round) shifts
    the network mean a little more each round.

    Why one residual *per sender*, not per link, although partners change every round:
    what enters the network mean is the error weighted by the receivers' mixing weights
    (W_ji), and in `1peer` / `2peer` that total weight is the same every round whoever the
    partners are (1/2, or 2 × 1/3) — the same message goes to every partner of the round.
    So the per-sender errors telescope in the network mean. A per-link residual would be
    wrong here: the residual for link i→j would wait for j to be i's partner again, which
    may be many rounds away, and meanwhile the mean stays biased. Two limits, both bounded
    (one round's error, not a drift): a round whose weight is renormalized (a partner
    dropped) or whose message nobody received still advances the residual.

    With a codec per link (:class:`FeedbackBank`) a sender sends up to one message *per
    codec* in a round, all from the same θ̃. The telescoping argument holds per message
    stream: a stream's residual must be the error of *that stream's* last message, or
    ``q_t − x_t = e_t − e_{t+1}`` no longer holds for it. One residual shared by two codecs
    in one round would take θ̃ in twice (each encoding adds x to it) and send about 2·θ̃
    in the second codec. So each codec keeps its own residual, advanced once per round in
    which it is used. The limit is the per-link one above, at a smaller scale: a codec's
    residual waits while no link of this sender uses that codec, and the weight its stream
    carries changes as links move between codecs. Each such change leaves (the change of
    weight) × (one residual of that codec, under a quantization step) in the mean: an error
    per change of codec, bounded, not one per round, as long as links do not flip between
    codecs every round.

    Memory: the residual (numel float32) plus one chunk of scratch per thread;
    ``encode_chunk`` works span by span so a streaming sender never holds a second
    full-size float copy. Different chunks may be encoded from different threads at once.
    """

    def __init__(self, codec: Codec, numel: int) -> None:
        self.codec = codec
        self.numel = numel
        self.residual = torch.zeros(0 if codec.lossless else numel, dtype=torch.float32)
        # One scratch per thread: a streaming sender encodes different chunks in parallel
        # worker threads, and a shared scratch would mix their decodes into the residual.
        self._local = threading.local()

    def encode_chunk(self, src: torch.Tensor, elem_start: int, out: torch.Tensor) -> None:
        """Encode ``src`` (elements ``elem_start:elem_start + len``) + residual into ``out``."""
        if self.codec.lossless:
            self.codec.encode_into(src, out)
            return
        n = src.numel()
        if elem_start < 0 or elem_start + n > self.numel:
            raise ValueError(f"chunk [{elem_start}, {elem_start + n}) outside 0..{self.numel}")
        res = self.residual[elem_start : elem_start + n]
        res.add_(src)  # res now holds x + e, the value we try to send
        self.codec.encode_into(res, out)
        scratch: torch.Tensor | None = getattr(self._local, "scratch", None)
        if scratch is None or scratch.numel() < n:
            scratch = self._local.scratch = torch.empty(n, dtype=torch.float32)
        decoded = scratch[:n]
        self.codec.decode(out, decoded)
        res.sub_(decoded)  # e ← (x + e) − decode(q)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """Encode ``src + residual`` and update the residual; returns fresh uint8 bytes."""
        _check_float_vector(src, "src")
        if src.numel() != self.numel:
            raise ValueError(f"error feedback holds {self.numel} elements, got {src.numel()}")
        out = torch.empty(self.codec.encoded_nbytes(self.numel), dtype=torch.uint8)
        for e0, e1, b0, b1 in chunk_spans(self.codec, self.numel, 4 << 20):
            self.encode_chunk(src[e0:e1], e0, out[b0:b1])
        return out


class FeedbackBank:
    """One :class:`ErrorFeedback` per codec a sender actually uses, created on first use.

    For a sender whose partners may each get a different codec in the same round (a codec
    per link): each codec's message stream keeps its own residual (see the last paragraph
    of :class:`ErrorFeedback` for why one shared residual would be wrong). A codec never
    used costs nothing; lossless codecs need no residual (:meth:`for_codec` gives None).
    The residuals of codecs a sender stopped using are kept: they are still owed to the
    network mean and go out with that codec's next message.
    """

    def __init__(self, numel: int) -> None:
        if numel < 0:
            raise ValueError(f"numel must be >= 0, got {numel}")
        self.numel = numel
        self._feedback: dict[str, ErrorFeedback] = {}

    def for_codec(self, codec: str | Codec) -> ErrorFeedback | None:
        """The residual for ``codec`` (a name or a codec), None for a lossless one."""
        c = get_codec(codec) if isinstance(codec, str) else codec
        if c.lossless:
            return None
        fb = self._feedback.get(c.name)
        if fb is None:
            fb = self._feedback[c.name] = ErrorFeedback(c, self.numel)
        return fb

    @property
    def codecs(self) -> tuple[str, ...]:
        """The lossy codecs that have a residual, in order of first use."""
        return tuple(self._feedback)


def roundtrip(
    codec: Codec, src: torch.Tensor, feedback: ErrorFeedback | None = None
) -> torch.Tensor:
    """What a receiver decodes when ``src`` is sent with ``codec`` (and ``feedback``)."""
    data = feedback.encode(src) if feedback is not None else codec.encode(src)
    out = torch.empty(src.numel(), dtype=torch.float32)
    codec.decode(data, out)
    return out

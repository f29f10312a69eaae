"""An in-process transport with the wire's semantics, for the simulator and tests.

It does what the gRPC exchange does to a tensor — encode once per round with the
sender's error feedback, decode on the receiving side — and lets a test or a simulation
break links: a fault hook decides, per round and edge, whether an exchange fails. A
failed exchange fails for both ends, as a broken stream does on the real wire.

A codec per link, as on the wire (:func:`~gaslocd.net.stream.round_messages`): a sender
posts its θ̃ once; ``fetch(round, sender, codec)`` gives what a partner decodes of it in
that codec, encoded once per (round, sender, codec) with that sender's residual for that
codec (:class:`~gaslocd.net.codecs.FeedbackBank`), however many partners fetch it. The
transport's own codec is encoded at ``post`` as before, so a run without per-link codecs
behaves exactly as it did; the others when first fetched (or exchanged).

Importing this module pulls in neither grpc nor hivemind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from gaslocd.net.codecs import Codec, FeedbackBank, get_codec, roundtrip

EdgeFault = Callable[[int, str, str], bool]
"""(round, a, b) → True when the exchange between a and b fails that round."""


def fail_at(schedule: Iterable[tuple[int, str]]) -> EdgeFault:
    """Peer ``p`` is down in round ``r`` for each (r, p): all its exchanges fail."""
    down = set(schedule)
    return lambda r, a, b: (r, a) in down or (r, b) in down


def cut_links(schedule: Iterable[tuple[int, str, str]]) -> EdgeFault:
    """The link a–b is cut in round ``r`` for each (r, a, b), in either direction."""
    cut = {(r, min(a, b), max(a, b)) for r, a, b in schedule}
    return lambda r, a, b: (r, min(a, b), max(a, b)) in cut


@dataclass
class LinkStats:
    """One peer's traffic; ``sent_by_codec``: bytes sent per codec name."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    failed_exchanges: int = 0
    sent_by_codec: dict[str, int] = field(default_factory=dict)


@dataclass
class InMemoryTransport:
    """Round-scoped mailboxes: ``post`` what you offer, ``fetch`` what a partner decoded.

    Memory: per posted (round, sender), the transport's own decoding and, for a lossy
    codec_name, a copy of the posted θ̃ to encode the other codecs from; plus one
    decoding per other codec fetched. ``end_round`` frees them.
    """

    codec_name: str
    numel: int
    edge_fails: EdgeFault | None = None
    codec: Codec = field(init=False)
    stats: dict[str, LinkStats] = field(init=False, default_factory=dict)
    _banks: dict[str, FeedbackBank] = field(init=False, default_factory=dict)
    _posted: dict[tuple[int, str], torch.Tensor] = field(init=False, default_factory=dict)
    _decoded: dict[tuple[int, str, str], torch.Tensor] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.codec = get_codec(self.codec_name)

    @property
    def message_bytes(self) -> int:
        """Encoded size of one model-sized message in the transport's own codec."""
        return self.codec.encoded_nbytes(self.numel)

    def message_bytes_for(self, codec: str | None) -> int:
        """Encoded size of one model-sized message in ``codec`` (None: the transport's)."""
        return (self.codec if codec is None else get_codec(codec)).encoded_nbytes(self.numel)

    def _stats(self, peer: str) -> LinkStats:
        return self.stats.setdefault(peer, LinkStats())

    def post(self, round_index: int, sender: str, tensor: torch.Tensor) -> None:
        """Offer ``sender``'s θ̃ for the round: encoded once, as the wire would send it."""
        if tensor.numel() != self.numel:
            raise ValueError(f"expected {self.numel} elements from {sender}, got {tensor.numel()}")
        flat = tensor.detach().float().reshape(-1)
        # A fresh tensor whatever the codec (the sender keeps training on its own).
        decoded = self._encode(sender, self.codec, flat)
        self._decoded[(round_index, sender, self.codec_name)] = decoded
        # fp32's decoding is the θ̃ itself: no second copy to encode other codecs from.
        self._posted[(round_index, sender)] = decoded if self.codec.lossless else flat.clone()

    def _encode(self, sender: str, codec: Codec, flat: torch.Tensor) -> torch.Tensor:
        bank = self._banks.get(sender)
        if bank is None:
            bank = self._banks[sender] = FeedbackBank(self.numel)
        return roundtrip(codec, flat, bank.for_codec(codec))

    def exchange(
        self, round_index: int, a: str, b: str, codecs: tuple[str | None, str | None] = (None, None)
    ) -> bool:
        """Run the a–b exchange of the round; False (for both ends) when it fails.

        ``codecs``: what a sends b in, and what b sends a in (None: the transport's
        codec); the bytes are counted in those codecs, and their messages are encoded
        now, as a stream would encode them.
        """
        for peer in (a, b):
            if (round_index, peer) not in self._posted:
                raise RuntimeError(f"{peer} has posted nothing for round {round_index}")
        if self.edge_fails is not None and self.edge_fails(round_index, a, b):
            self._stats(a).failed_exchanges += 1
            self._stats(b).failed_exchanges += 1
            return False
        for (src, dst), name in zip(((a, b), (b, a)), codecs, strict=True):
            self.fetch(round_index, src, name)
            nbytes = self.message_bytes_for(name)
            sent = self._stats(src)
            sent.bytes_sent += nbytes
            sent.messages_sent += 1
            key = self.codec_name if name is None else name
            sent.sent_by_codec[key] = sent.sent_by_codec.get(key, 0) + nbytes
            self._stats(dst).bytes_received += nbytes
        return True

    def fetch(self, round_index: int, sender: str, codec: str | None = None) -> torch.Tensor:
        """What a partner of ``sender`` decoded this round in ``codec`` (None: the
        transport's); encoded once per (round, sender, codec). Read-only by convention."""
        name = self.codec_name if codec is None else codec
        got = self._decoded.get((round_index, sender, name))
        if got is not None:
            return got
        posted = self._posted.get((round_index, sender))
        if posted is None:
            raise RuntimeError(f"{sender} has posted nothing for round {round_index}")
        got = self._decoded[(round_index, sender, name)] = self._encode(
            sender, get_codec(name), posted
        )
        return got

    def end_round(self, round_index: int) -> None:
        """Free the round's mailboxes."""
        for key in [k for k in self._posted if k[0] == round_index]:
            del self._posted[key]
        for dkey in [k for k in self._decoded if k[0] == round_index]:
            del self._decoded[dkey]

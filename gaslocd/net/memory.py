"""An in-process transport with the wire's semantics, for the simulator and tests.

It does what the gRPC exchange does to a tensor — encode once per round with the
sender's error feedback, decode on the receiving side — and lets a test or a simulation
break links: a fault hook decides, per round and edge, whether an exchange fails. A
failed exchange fails for both ends, as a broken stream does on the real wire.

Importing this module pulls in neither grpc nor hivemind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from gaslocd.net.codecs import Codec, ErrorFeedback, get_codec, roundtrip

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
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    failed_exchanges: int = 0


@dataclass
class InMemoryTransport:
    """Round-scoped mailboxes: ``post`` what you offer, ``fetch`` what a partner offered."""

    codec_name: str
    numel: int
    edge_fails: EdgeFault | None = None
    codec: Codec = field(init=False)
    stats: dict[str, LinkStats] = field(init=False, default_factory=dict)
    _feedback: dict[str, ErrorFeedback] = field(init=False, default_factory=dict)
    _posted: dict[tuple[int, str], torch.Tensor] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.codec = get_codec(self.codec_name)

    @property
    def message_bytes(self) -> int:
        """Encoded size of one model-sized message."""
        return self.codec.encoded_nbytes(self.numel)

    def _stats(self, peer: str) -> LinkStats:
        return self.stats.setdefault(peer, LinkStats())

    def post(self, round_index: int, sender: str, tensor: torch.Tensor) -> None:
        """Offer ``sender``'s θ̃ for the round: encoded once, as the wire would send it."""
        if tensor.numel() != self.numel:
            raise ValueError(f"expected {self.numel} elements from {sender}, got {tensor.numel()}")
        feedback = None
        if not self.codec.lossless:
            feedback = self._feedback.get(sender)
            if feedback is None:
                feedback = self._feedback[sender] = ErrorFeedback(self.codec, self.numel)
        decoded = roundtrip(self.codec, tensor.detach().float().reshape(-1), feedback)
        self._posted[(round_index, sender)] = decoded

    def exchange(self, round_index: int, a: str, b: str) -> bool:
        """Run the a–b exchange of the round; False (for both ends) when it fails."""
        for peer in (a, b):
            if (round_index, peer) not in self._posted:
                raise RuntimeError(f"{peer} has posted nothing for round {round_index}")
        if self.edge_fails is not None and self.edge_fails(round_index, a, b):
            self._stats(a).failed_exchanges += 1
            self._stats(b).failed_exchanges += 1
            return False
        for src, dst in ((a, b), (b, a)):
            self._stats(src).bytes_sent += self.message_bytes
            self._stats(src).messages_sent += 1
            self._stats(dst).bytes_received += self.message_bytes
        return True

    def fetch(self, round_index: int, sender: str) -> torch.Tensor:
        """What any partner of ``sender`` decoded this round (read-only by convention)."""
        return self._posted[(round_index, sender)]

    def end_round(self, round_index: int) -> None:
        """Free the round's mailboxes."""
        for key in [k for k in self._posted if k[0] == round_index]:
            del self._posted[key]

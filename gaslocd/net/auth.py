"""Call authentication from gRPC metadata: who calls, for whom, and that it is fresh.

The join token never goes on the wire. Every call carries, in its metadata, a *claim*
(sender id, target id, run id, method, round, a timestamp and a random nonce), an
HMAC-SHA256 of the claim under the **run key** and an RSA signature of the claim by the
sender's peer key (the key whose hash is its DHT peer id, published in the roster):

    run key = HMAC-SHA256(key=token, msg="gaslocd/run-key/" + run_id)

With no token (loopback-only runs) the HMAC key is derived from the run id alone: it then
only keeps other runs out, not strangers. The receiver checks, before it reads a message
or holds a slot: the HMAC (constant time; a caller without the token is dropped at once),
the target (a blob captured by a sybil server cannot be replayed to another peer), the
timestamp (within ``window_s``), the signature against the sender's key from the roster
(an insider cannot claim another peer's id) and last the nonce (not seen within the
window: a blob cannot be replayed to the same peer). A caller not (yet) in our roster
(a newcomer fetching state before it publishes) is still authenticated when it sends
its public key and that key hashes to its peer id (``peer_id_of_key``: libp2p's rule,
the same one the roster's records are checked with). The acceptor of a call proves
itself too: its initial metadata signs (the caller's nonce, its id, run, round), which
the dialer checks before it sends any θ̃ data, so a process at a partner's address that
does not hold the partner's key learns nothing and feeds nothing.

``gaslocd status`` (an operator tool, no roster, no peer key) authenticates with the HMAC
alone; a daemon answers only ``Status`` to such a call.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:  # hivemind (and torch with it) is imported only to parse a peer's key:
    # `gaslocd status`, the container health check, signs nothing and must start fast.
    from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

_P = "gaslocd-"
_FIELDS = ("sender", "target", "run", "method", "round", "time", "nonce")
_MAX_VALUE = 256  # characters per metadata value (ids, base64 signature: ~350 for 2048 bits)
_MAX_SIG = 1024
Metadata = Sequence[tuple[str, str | bytes]]
PublicKeyOf = Callable[[str], bytes | None]
PeerIdOfKey = Callable[[bytes], str]

# label -> status code. The labels are the bounded set of ``gasloc_calls_refused_total``.
_CODES: dict[str, grpc.StatusCode] = {
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,  # no or wrong HMAC: no token
    "wrong-target": grpc.StatusCode.FAILED_PRECONDITION,
    "clock-skew": grpc.StatusCode.PERMISSION_DENIED,
    "unknown-peer": grpc.StatusCode.UNAVAILABLE,  # not (yet) in our roster: retry later
    "bad-signature": grpc.StatusCode.PERMISSION_DENIED,
    "replay": grpc.StatusCode.PERMISSION_DENIED,
}


class AuthFailure(Exception):
    """A call's credentials do not hold; ``reason`` is a stable metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    @property
    def code(self) -> grpc.StatusCode:
        return _CODES.get(self.reason, grpc.StatusCode.PERMISSION_DENIED)


def run_key(token: str, run_id: str) -> bytes:
    """The HMAC key of a run: never the token itself, and different for every run."""
    return hmac.new(token.encode(), b"gaslocd/run-key/" + run_id.encode(), hashlib.sha256).digest()


def _packed(tag: bytes, values: Sequence[str]) -> bytes:
    """Length-prefixed fields: no two different claims sign the same bytes."""
    out = bytearray(tag)
    for value in values:
        raw = value.encode()
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


@dataclass(frozen=True)
class Claim:
    """What a call says about itself; authentic once :meth:`CallAuth.verify` returned it."""

    sender: str
    target: str
    run: str
    method: str
    round: int
    time_ms: int
    nonce: str

    def values(self) -> tuple[str, ...]:
        r, t = str(self.round), str(self.time_ms)
        return (self.sender, self.target, self.run, self.method, r, t, self.nonce)

    def signed_bytes(self) -> bytes:
        return _packed(b"gaslocd/call/v1", self.values())


def _text(md: dict[str, str], key: str) -> str:
    value = md.get(_P + key, "")
    if len(value) > (_MAX_SIG if key in ("sig", "proof", "key") else _MAX_VALUE):
        raise AuthFailure("unauthenticated", f"metadata {key} is too long")
    return value


def _as_dict(metadata: Metadata | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in metadata or ():
        if key.startswith(_P) and isinstance(value, str):
            out[key] = value
    return out


class CallAuth:
    """Signs our calls and verifies others'. Loop-thread only (the nonce cache)."""

    def __init__(
        self,
        run_id: str,
        token: str,
        my_peer_id: str,
        private_key: RSAPrivateKey | None,
        public_key_of: PublicKeyOf,
        *,
        peer_id_of_key: PeerIdOfKey | None = None,
        window_s: float = 120.0,
        nonces_kept: int = 65536,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.run_id = run_id
        self.my_peer_id = my_peer_id
        self._key = run_key(token, run_id)
        self._private = private_key
        self._public_key_of = public_key_of
        self._peer_id_of_key = peer_id_of_key
        own = private_key.get_public_key().to_bytes() if private_key is not None else b""
        self._own_key = own.decode()
        self._window_ms = int(window_s * 1000)
        self._nonces: OrderedDict[str, int] = OrderedDict()  # nonce -> its claim's time
        self._nonces_kept = nonces_kept
        self._clock = clock
        self._parsed: dict[bytes, RSAPublicKey] = {}

    # -- the calling side ----------------------------------------------------------------

    def metadata(self, target: str, method: str, round_: int = 0) -> tuple[Metadata, Claim]:
        """Credentials for one call to ``target`` (its nonce is in the returned claim)."""
        claim = Claim(
            self.my_peer_id,
            target,
            self.run_id,
            method,
            round_,
            int(self._clock() * 1000),
            secrets.token_hex(16),
        )
        signed = claim.signed_bytes()
        md: list[tuple[str, str | bytes]] = [
            (_P + k, v) for k, v in zip(_FIELDS, claim.values(), strict=True)
        ]
        md.append((_P + "mac", hmac.new(self._key, signed, hashlib.sha256).hexdigest()))
        if self._private is not None:
            md.append((_P + "sig", self._private.sign(signed).decode()))
            md.append((_P + "key", self._own_key))
        return tuple(md), claim

    def check_proof(self, metadata: Metadata | None, claim: Claim) -> None:
        """The acceptor's proof (its initial metadata) that it holds ``claim.target``'s key."""
        md = _as_dict(metadata)
        proof = _text(md, "proof")
        if not proof:
            raise AuthFailure("bad-signature", f"{claim.target[:64]} sent no proof of identity")
        key = self._public_key(claim.target, _text(md, "key").encode())
        if not key.verify(self._proof_bytes(claim, claim.target), proof.encode()):
            raise AuthFailure("bad-signature", f"the acceptor is not {claim.target[:64]}")

    # -- the answering side --------------------------------------------------------------

    def verify(
        self,
        metadata: Metadata | None,
        method: str,
        *,
        signed: bool = True,
        open_target: bool = False,
    ) -> Claim:
        """The caller's claim, or :class:`AuthFailure`; cheap checks first.

        ``signed=False`` (``Status`` only) accepts an HMAC-valid claim without a peer key.
        ``open_target`` also accepts an empty target: for ``Status`` and for ``Ready``,
        whose notice ("I finished round r") is true wherever it is replayed.
        """
        md = _as_dict(metadata)
        try:
            values = [_text(md, k) for k in _FIELDS]
            sender, target, run, called, round_, time_ms, nonce = values
            claim = Claim(sender, target, run, called, int(round_), int(time_ms), nonce)
        except ValueError:
            raise AuthFailure("unauthenticated", "malformed call metadata") from None
        mac = _text(md, "mac")
        want = hmac.new(self._key, claim.signed_bytes(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac.encode(), want.encode()):
            raise AuthFailure("unauthenticated", "no valid run credential (join token)")
        if claim.run != self.run_id or claim.method != method:
            raise AuthFailure("wrong-target", "credentials for another run or method")
        if claim.target != self.my_peer_id and not (open_target and claim.target == ""):
            raise AuthFailure("wrong-target", f"credentials for {claim.target[:64]!r}, not us")
        now_ms = int(self._clock() * 1000)
        if abs(now_ms - claim.time_ms) > self._window_ms:
            raise AuthFailure("clock-skew", f"timestamp {(claim.time_ms - now_ms) / 1000:+.0f} s")
        if signed:
            key = self._public_key(claim.sender, _text(md, "key").encode())
            if not key.verify(claim.signed_bytes(), _text(md, "sig").encode()):
                raise AuthFailure("bad-signature", f"not signed by {claim.sender[:64]}'s key")
        self._remember(claim, now_ms)
        return claim

    def proof(self, claim: Claim) -> Metadata:
        """Our initial metadata for a verified call: we hold the key of the id it called."""
        if self._private is None:
            return ()
        signature = self._private.sign(self._proof_bytes(claim, self.my_peer_id))
        return ((_P + "proof", signature.decode()), (_P + "key", self._own_key))

    def _proof_bytes(self, claim: Claim, acceptor: str) -> bytes:
        return _packed(b"gaslocd/accept/v1", (claim.nonce, acceptor, claim.run, str(claim.round)))

    def _public_key(self, peer: str, offered: bytes = b"") -> RSAPublicKey:
        """``peer``'s key from the roster, or the one it offered if that key is its id
        (peer ids are key hashes, so this is as strong; it spares a roster read that
        missed the peer for a moment, or a newcomer not published yet)."""
        raw = self._public_key_of(peer)
        if raw is None and offered and self._peer_id_of_key is not None:
            with contextlib.suppress(Exception):  # garbage keys raise several types
                raw = offered if self._peer_id_of_key(offered) == peer else None
        if raw is None:
            raise AuthFailure("unknown-peer", f"{peer[:64]!r} is not in our roster")
        key = self._parsed.get(raw)
        if key is None:
            try:
                from hivemind.utils.crypto import RSAPublicKey

                key = RSAPublicKey.from_bytes(raw)
            except ValueError:
                raise AuthFailure("unknown-peer", "the roster's key does not parse") from None
            if len(self._parsed) > 4096:
                self._parsed.clear()
            self._parsed[raw] = key
        return key

    def _remember(self, claim: Claim, now_ms: int) -> None:
        """Refuse a nonce seen within the window; forget nonces the window already refuses."""
        if claim.nonce in self._nonces:
            raise AuthFailure("replay", "these credentials were already used")
        self._nonces[claim.nonce] = claim.time_ms
        while self._nonces:
            oldest, at = next(iter(self._nonces.items()))
            if len(self._nonces) <= self._nonces_kept and now_ms - at <= self._window_ms:
                break
            del self._nonces[oldest]


REFUSAL_REASONS = (*_CODES, "busy-peer", "busy", "busy-state")

"""Call credentials (gaslocd/net/auth.py) without a network: what each check refuses."""

from __future__ import annotations

import pytest
from hivemind.utils.crypto import RSAPrivateKey
from testkeys import auth_for, private_key, public_key_of

from gaslocd.net.auth import AuthFailure, CallAuth, run_key
from gaslocd.net.roster_auth import peer_id_of_owner

RUN = "auth-run"


def _reason(auth: CallAuth, metadata: object, method: str = "Exchange", **kw: object) -> str:
    with pytest.raises(AuthFailure) as failure:
        auth.verify(metadata, method, **kw)  # type: ignore[arg-type]
    return failure.value.reason


def test_a_good_call_is_accepted_once_and_says_who_calls() -> None:
    a, b = auth_for(RUN, "peer-a"), auth_for(RUN, "peer-b")
    metadata, sent = a.metadata("peer-b", "Exchange", 7)
    claim = b.verify(metadata, "Exchange")
    assert (claim.sender, claim.target, claim.round, claim.nonce) == (
        "peer-a",
        "peer-b",
        7,
        sent.nonce,
    )
    assert _reason(b, metadata) == "replay"  # the same blob again, to the same peer
    assert _reason(auth_for(RUN, "peer-c"), metadata) == "wrong-target"  # to another peer


def test_the_token_never_appears_in_the_metadata() -> None:
    token = "s3cret-join-token"
    metadata, _ = auth_for(RUN, "peer-a", token).metadata("peer-b", "GetState")
    blob = repr(metadata).encode()
    assert token.encode() not in blob and run_key(token, RUN).hex().encode() not in blob


def test_each_check_names_its_reason() -> None:
    b = auth_for(RUN, "peer-b")
    assert _reason(b, ()) == "unauthenticated"
    wrong_token = auth_for(RUN, "peer-a", "other").metadata("peer-b", "Exchange")[0]
    assert _reason(b, wrong_token) == "unauthenticated"
    tampered = [
        (k, "peer-z" if k == "gaslocd-sender" else v)
        for k, v in auth_for(RUN, "peer-a").metadata("peer-b", "Exchange")[0]
    ]
    assert _reason(b, tampered) == "unauthenticated"  # the HMAC covers every field
    other_run = CallAuth("run-2", "tok", "peer-a", private_key("peer-a"), public_key_of)
    assert _reason(b, other_run.metadata("peer-b", "Exchange")[0]) == "unauthenticated"
    good = auth_for(RUN, "peer-a").metadata("peer-b", "Exchange")[0]
    assert _reason(b, good, "GetState") == "wrong-target"  # another method
    old = auth_for(RUN, "peer-a", clock=lambda: 1000.0).metadata("peer-b", "Exchange")[0]
    assert _reason(b, old) == "clock-skew"
    insider = CallAuth(RUN, "tok", "peer-a", private_key("peer-insider"), public_key_of)
    assert _reason(b, insider.metadata("peer-b", "Exchange")[0]) == "bad-signature"
    stranger = CallAuth(RUN, "tok", "nobody-knows-me", RSAPrivateKey(), lambda _p: None)
    assert _reason(b, stranger.metadata("peer-b", "Exchange")[0]) == "unknown-peer"
    unsigned = CallAuth(RUN, "tok", "op", None, lambda _p: None).metadata("", "Status")[0]
    assert _reason(b, unsigned, "Status") == "wrong-target"  # an empty target is not open
    assert b.verify(unsigned, "Status", signed=False, open_target=True).sender == "op"
    assert _reason(b, auth_for(RUN, "peer-a").metadata("", "Exchange")[0]) == "wrong-target"


def test_a_self_certified_newcomer_is_known_by_its_key() -> None:
    """A caller not in the roster passes if the key it offers is its peer id."""
    key = RSAPrivateKey()
    me = peer_id_of_owner(key.get_public_key().to_bytes())
    server = auth_for(RUN, "peer-b", peer_id_of_key=peer_id_of_owner)
    newcomer = CallAuth(RUN, "tok", me, key, lambda _p: None)
    assert server.verify(newcomer.metadata("peer-b", "GetState")[0], "GetState").sender == me
    # the same key under a name that is not its id is refused
    liar = CallAuth(RUN, "tok", "peer-a-fake", key, lambda _p: None)
    assert _reason(server, liar.metadata("peer-b", "GetState")[0], "GetState") == "unknown-peer"


def test_the_acceptor_proves_it_holds_the_target_key() -> None:
    a = auth_for(RUN, "peer-a")
    metadata, claim = a.metadata("peer-b", "Exchange", 3)
    real = auth_for(RUN, "peer-b")
    a.check_proof(real.proof(real.verify(metadata, "Exchange")), claim)
    sybil = CallAuth(RUN, "tok", "peer-b", private_key("peer-sybil"), public_key_of)
    with pytest.raises(AuthFailure, match="bad-signature"):
        a.check_proof(sybil.proof(claim), claim)
    with pytest.raises(AuthFailure, match="bad-signature"):
        a.check_proof((), claim)
    _, other = a.metadata("peer-b", "Exchange", 3)  # a proof is for one nonce only
    with pytest.raises(AuthFailure, match="bad-signature"):
        a.check_proof(real.proof(claim), other)


def test_the_nonce_memory_is_bounded() -> None:
    b = auth_for(RUN, "peer-b", nonces_kept=16)
    a = auth_for(RUN, "peer-a")
    for _ in range(100):
        b.verify(a.metadata("peer-b", "Ready")[0], "Ready")
    assert len(b._nonces) <= 16

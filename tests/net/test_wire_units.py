"""The wire's pieces without sockets: framing, checks, the rendezvous, the receiver."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
import torch

from gaslocd.config import WireConfig
from gaslocd.net.codecs import ErrorFeedback, get_codec
from gaslocd.net.frames import MalformedMessage, frame_data, frame_header, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.rendezvous import ExchangeFailure, RoundBoard, RoundOffer, dials
from gaslocd.net.stream import OutgoingMessage, Receiver, run_duplex
from gaslocd.net.validation import (
    Identity,
    Refusal,
    check_payload,
    check_sender,
    check_static,
    reason_from_details,
)
from gaslocd.protocol.sitout import SitOut

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


# -- frames ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 3 << 20])
def test_data_frames_are_exactly_protobufs_encoding(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    framed = frame_data(payload)
    assert framed == pb.Chunk(data=payload).SerializeToString()
    parsed = parse_chunk(framed)
    assert parsed.kind == "data" and bytes(parsed.data or b"") == payload


def test_headers_and_garbage() -> None:
    h = pb.ExchangeHeader(run_id="r", round=3, sender="s", codec="int8", numel=5)
    assert parse_chunk(frame_header(h)).header == h
    for junk in (b"\xff\xff\xff", b"\x12\x05ab", b""):
        with pytest.raises(MalformedMessage):
            parse_chunk(junk)
    # data written by protobuf with an extra field still parses (slow path, last wins)
    two = pb.Chunk(data=b"first").SerializeToString() + pb.Chunk(data=b"xy").SerializeToString()
    assert bytes(parse_chunk(two).data or b"") == b"xy"


# -- checks ----------------------------------------------------------------------------


def test_static_checks_and_reasons() -> None:
    me = Identity("run", "me", "fp")
    check_static(me, "run", "fp")
    with pytest.raises(Refusal, match="wrong-run"):
        check_static(me, "other", "fp")
    with pytest.raises(Refusal, match="fingerprint"):
        check_static(me, "run", "other")
    check_sender("me", "me")
    with pytest.raises(Refusal, match="wrong-sender"):
        check_sender("someone-else", "me")
    with pytest.raises(ValueError):
        Refusal("no-such-reason")
    assert reason_from_details("norm-bound: too far") == "norm-bound"
    assert reason_from_details("Internal error from Core") == "other"


def _header(**kw: object) -> pb.ExchangeHeader:
    base: dict[str, object] = {
        "codec": "int8",
        "numel": 5000,
        "encoded_nbytes": get_codec("int8").encoded_nbytes(5000),
        "chunk_bytes": 1 << 20,
    }
    return pb.ExchangeHeader(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"codec": "lz4"}, "unknown-codec"),
        ({"numel": 5001}, "size-mismatch"),
        ({"encoded_nbytes": 1 << 40}, "size-mismatch"),
        ({"chunk_bytes": 0}, "bad-chunk-size"),
        ({"chunk_bytes": 64 << 20}, "bad-chunk-size"),
        ({"roster_digest": b"theirs"}, "roster-mismatch"),
    ],
)
def test_payload_checks(fields: dict[str, object], reason: str) -> None:
    config = WireConfig()
    assert check_payload(config, _header(), 5000, b"ours").name == "int8"
    with pytest.raises(Refusal) as refused:
        check_payload(config, _header(**fields), 5000, b"ours")
    assert refused.value.reason == reason


def test_codec_not_allowed() -> None:
    with pytest.raises(Refusal, match="codec-not-allowed"):
        check_payload(WireConfig(codecs=("fp32",)), _header(), 5000, b"")


def test_wire_config_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        WireConfig(chunk_bytes=8 << 20, max_chunk_bytes=4 << 20)
    with pytest.raises(ValueError, match="both"):
        WireConfig(tls_cert="c.pem")
    with pytest.raises(ValueError, match="codec"):
        WireConfig(codecs=("zstd",))
    assert WireConfig().max_message_bytes == (4 << 20) + (64 << 10)


# -- rendezvous ------------------------------------------------------------------------


def test_exactly_one_side_dials() -> None:
    assert dials("a", "b") and not dials("b", "a")
    with pytest.raises(ValueError):
        dials("a", "a")


def _offer(round_: int, partners: dict[str, str], pool: ThreadPoolExecutor) -> RoundOffer:
    msg = OutgoingMessage(torch.ones(10), get_codec("fp32"), 1 << 20, pool)
    return RoundOffer(round_, msg, partners, b"", math.sqrt(10), [])


def test_claims() -> None:
    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            board = RoundBoard("m", round_lead=1)
            waiter = asyncio.ensure_future(board.claim(5, "a", timeout_s=5))  # early caller
            await asyncio.sleep(0)
            assert not waiter.done()
            board.open(_offer(5, {"a": "x", "z": "y"}, pool))
            assert (await waiter).round == 5

            async def refused(round_: int, sender: str, timeout_s: float = 1.0) -> str:
                with pytest.raises(Refusal) as exc:
                    await board.claim(round_, sender, timeout_s)
                return exc.value.reason

            assert await refused(5, "a") == "duplicate"
            assert await refused(5, "q") == "not-a-partner"
            assert await refused(5, "z") == "wrong-direction"  # "m" < "z": we dial z
            assert await refused(4, "a") == "stale-round"
            assert await refused(9, "a") == "future-round"
            assert await refused(6, "a", timeout_s=0.05) == "timeout"
            offer = board.offer
            assert offer is not None
            board.close(offer)
            assert await refused(5, "a") == "round-closed"
            outcome = offer.outcomes["z"].result()
            assert isinstance(outcome, ExchangeFailure) and outcome.reason == "deadline"
            with pytest.raises(ValueError):
                board.open(_offer(5, {}, pool))

    run(scenario())


def test_a_round_we_sat_out_counts_for_how_far_ahead_a_caller_may_be() -> None:
    """A peer sitting out opens no offer for those rounds; its partner of the round it
    rejoins must wait for that round to open, not be refused as too far ahead of the
    last round it offered."""

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            board = RoundBoard("m", round_lead=2)
            board.open(_offer(10, {"a": "x"}, pool))  # a long exchange, then 3 rounds out
            with pytest.raises(Refusal, match="too far ahead of 10"):
                await board.claim(14, "a", 1.0)
            board.at(13)  # the rounds were ours all the same
            waiter = asyncio.ensure_future(board.claim(14, "a", timeout_s=5))
            await asyncio.sleep(0)
            assert not waiter.done()
            board.open(_offer(14, {"a": "x"}, pool))
            assert (await waiter).round == 14
            with pytest.raises(Refusal, match="too far ahead of 14"):
                await board.claim(17, "a", 1.0)

    run(scenario())


def test_a_caller_in_a_round_we_sit_out_is_told_so_at_once() -> None:
    """A partner whose roster predates our sit-out (our record crosses the slow link
    late) calls us in a round we sit out: refused at once, not after its wait for an
    offer that will not come; our own round, and the round we rejoin, are unaffected."""

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            board = RoundBoard("m", round_lead=2)
            board.at(3)
            board.sit_out(SitOut(8, 5), 3)  # decided in round 3: paired in 8, 13, ...
            early = asyncio.ensure_future(board.claim(3, "a", timeout_s=5))  # round 3's
            await asyncio.sleep(0)
            with pytest.raises(Refusal, match="until round 8") as out:
                await board.claim(4, "a", timeout_s=60)
            assert out.value.reason == "sitting-out"
            board.open(_offer(3, {"a": "x"}, pool))  # the long exchange of round 3
            assert (await early).round == 3
            board.at(7)
            with pytest.raises(Refusal, match="sitting-out"):
                await board.claim(7, "a", timeout_s=60)
            back = asyncio.ensure_future(board.claim(8, "a", timeout_s=5))
            await asyncio.sleep(0)
            assert not back.done()
            board.open(_offer(8, {"a": "x"}, pool))
            assert (await back).round == 8
            with pytest.raises(Refusal, match="until round 13"):  # the schedule goes on
                await board.claim(9, "a", timeout_s=60)

    run(scenario())


def test_a_caller_waiting_for_our_next_round_is_told_at_once_that_we_stop() -> None:
    """A partner a round ahead waits for our next offer; we stop instead. Left waiting,
    its call was cancelled when the server's grace ended, and grpc logged that as an
    unhandled error with a traceback, at every clean stop (bench logs, 2026-12-08)."""

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            board = RoundBoard("m", round_lead=1)
            board.open(_offer(5, {"a": "x"}, pool))
            ahead = asyncio.ensure_future(board.claim(6, "a", timeout_s=60))
            await asyncio.sleep(0)
            assert not ahead.done()
            offer = board.offer
            assert offer is not None
            board.stop()
            with pytest.raises(Refusal, match="stopping") as out:
                await asyncio.wait_for(ahead, 1.0)
            assert out.value.reason == "round-closed"
            assert offer.closed.is_set()
            with pytest.raises(Refusal, match="stopping"):  # and so is every later call
                await board.claim(7, "a", timeout_s=60)

    run(scenario())


# -- streams ---------------------------------------------------------------------------


def _receiver(pool: ThreadPoolExecutor, reference: torch.Tensor, bound: float) -> Receiver:
    out = torch.empty(reference.numel())
    return Receiver(get_codec("fp32"), out, 4096, pool, 2, reference, bound * reference.norm())


def _chunks(t: torch.Tensor) -> list[memoryview]:
    raw = t.numpy().tobytes()
    return [memoryview(raw)[i : i + 4096] for i in range(0, len(raw), 4096)]


def test_receiver_refuses_what_it_must() -> None:
    async def scenario() -> None:
        ref = torch.randn(5000)
        with ThreadPoolExecutor(2) as pool:
            good = _receiver(pool, ref, 1.0)
            for c in _chunks(ref + 0.01):
                await good.add(c)
            assert torch.equal(await good.finish(), ref + 0.01)
            with pytest.raises(Refusal, match="oversize"):
                await good.add(_chunks(ref)[0])

            short = _receiver(pool, ref, 1.0)
            await short.add(_chunks(ref)[0])
            with pytest.raises(Refusal, match="truncated"):
                await short.finish()
            await short.close()

            wrong = _receiver(pool, ref, 1.0)
            with pytest.raises(Refusal, match="chunk-mismatch"):
                await wrong.add(memoryview(b"\x00" * 100))

            bad = ref.clone()
            bad[4999] = math.inf
            for tensor, reason in ((bad, "non-finite"), (ref * 5, "norm-bound")):
                receiver = _receiver(pool, ref, 1.0)
                with pytest.raises(Refusal, match=reason):
                    for c in _chunks(tensor):
                        await receiver.add(c)
                    await receiver.finish()
                await receiver.close()

    run(scenario())


def test_shared_message_encodes_each_chunk_once() -> None:
    """Two partners pull the same chunks: error feedback must advance once per round."""

    async def scenario() -> None:
        theta = torch.randn(10_000)
        codec = get_codec("int8")
        fb = ErrorFeedback(codec, theta.numel())
        with ThreadPoolExecutor(2) as pool:
            msg = OutgoingMessage(theta, codec, 4 * 1028, pool, fb)
            first = [await msg.framed(k) for k in range(len(msg.spans))]
            residual = fb.residual.clone()
            again = await asyncio.gather(*(msg.framed(k) for k in range(len(msg.spans))))
        assert first == list(again)
        assert torch.equal(fb.residual, residual)

    run(scenario())


def test_duplex_failure_cancels_the_other_side() -> None:
    async def scenario() -> None:
        cancelled = asyncio.Event()

        async def forever() -> int:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 0

        async def fails() -> int:
            raise Refusal("non-finite", "x")

        with pytest.raises(Refusal):
            await run_duplex(forever(), fails())
        assert cancelled.is_set()
        assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left behind

    run(scenario())


def test_a_rewound_board_opens_a_lower_round_and_only_then() -> None:
    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            board = RoundBoard("m", round_lead=1)
            old = _offer(40, {"a": "x"}, pool)
            board.open(old)
            with pytest.raises(ValueError, match="not after"):
                board.open(_offer(12, {"a": "x"}, pool))
            board.rewind()  # we ran ahead of the run: back to its round
            assert old.closed.is_set() and board.latest_round is None
            board.open(_offer(12, {"a": "x"}, pool))
            assert board.latest_round == 12

    asyncio.run(scenario())

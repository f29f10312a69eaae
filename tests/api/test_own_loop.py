"""The library API as a user runs it: README's own-loop example, two real processes, a real
DHT and real gRPC on 127.0.0.1; a Hugging Face Llama trained by the user's own loop, saved
and loaded back with ``transformers``. And the settings a Peer refuses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaslocd.cli import main
from tests.daemon.procs import Daemon, summary_rounds

README = Path(__file__).resolve().parents[2] / "README.md"
ROUNDS = 6  # max_rounds in the example


def readme_example() -> str:
    """The README's python block that builds a ``gaslocd.Peer`` (run as it is written)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if "gaslocd.Peer(" in b]
    assert len(found) == 1, "README must hold exactly one gaslocd.Peer example"
    return found[0]


def _flat(path: Path) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(path)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_two_peers_train_a_users_model_with_its_own_loop(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("datasets")
    script = tmp_path / "own_loop.py"
    script.write_text(readme_example())
    # The user's own dataset, tokenized with their own tokenizer: our sources, a BPE
    # trained on them here (no hub), shards by `gaslocd tokenize`.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [p.read_text() for p in sorted(README.parent.glob("gaslocd/*/*.py"))]
    for k, text in enumerate(texts):
        (corpus / f"{k}.txt").write_text(text)
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"])
    bpe.train_from_iterator(texts, trainer)
    bpe.save(str(tmp_path / "tokenizer.json"))
    data = tmp_path / "shards"
    argv = ["tokenize", str(corpus), "--tokenizer", str(tmp_path / "tokenizer.json")]
    assert main([*argv, "--out", str(data)]) == 0
    out = [tmp_path / "out0", tmp_path / "out1"]

    def run(k: int, *bootstrap: str) -> Daemon:
        argv = [sys.executable, str(script), str(data), str(k), str(out[k]), *bootstrap]
        return Daemon([], reaper, f"peer{k}", command=argv)

    first = run(0)
    address = first.wait_for(r"bootstrap address: (\S+)", 180).group(1)
    second = run(1, address)
    for peer in (first, second):
        assert peer.finish(300) == 0, peer.output()
    for k, peer in enumerate((first, second)):
        rounds = summary_rounds(Path(f"{out[k]}.json"))
        assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), peer.output()
        assert all(r["exchanged"] == 1 for r in rounds), peer.output()  # the other peer
        assert rounds[-1]["train_loss"] < rounds[0]["train_loss"]  # the user's loop learned
    assert "took state of round" in second.output()  # the joiner started from the first's θ
    a, b = _flat(out[0]), _flat(out[1])
    # Paired every round with a doubly stochastic W, the two ends mix alike, up to the
    # fp16 wire and robust mixing (an end that clips its partner's θ̃ to its trust radius
    # mixes less of it): seen up to 0.012 of ‖θ‖ apart under load. Trained apart on their
    # streams the same 70 steps, the two end ~0.28 of ‖θ‖ apart (measured).
    assert float((a - b).norm()) < 0.05 * float(a.norm())
    loaded = transformers.AutoTokenizer.from_pretrained(str(out[0]))
    assert loaded.encode(texts[0][:500]) == bpe.encode(texts[0][:500]).ids


def test_settings_the_users_loop_owns_or_the_daemon_lacks_are_refused() -> None:
    from gaslocd.peer import peer_settings

    with pytest.raises(ValueError, match="inner_lr: your own loop sets this"):
        peer_settings("start", {"inner_lr": 1e-3})
    with pytest.raises(ValueError, match="unknown setting 'inner_step'"):
        peer_settings("start", {"inner_step": 5})
    resolved = peer_settings(
        "join", {"bootstrap": ["/ip4/127.0.0.1/tcp/1/p2p/Qm"], "topology": "2peer"}
    )
    assert resolved["bootstrap"] == ("/ip4/127.0.0.1/tcp/1/p2p/Qm",)
    assert resolved["topology"] == "2peer" and resolved["inner_steps"] is None  # the default
    assert "bootstrap" not in peer_settings("start", {"bootstrap": []})
    from gaslocd.peer import Peer

    with pytest.raises(ValueError, match="without --token"):  # reachable: needs the credential
        Peer(torch.nn.Linear(2, 2), host="0.0.0.0", run_id="open")


def test_a_peer_resumes_its_round_theta_and_optimizer_from_its_checkpoint(tmp_path: Path) -> None:
    """In this process: a Peer's daemon runs on a thread, its DHT in a child process."""
    from gaslocd.peer import Peer

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(peer: Peer, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
        steps = 0
        with peer:
            while True:
                x = torch.randn(32, 8)
                loss = (model(x) - x[:, :1]).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                steps += 1
                if not peer.step(loss):
                    return steps

    settings = {"run_id": "resume", "port": 0, "inner_steps": 4, "checkpoint_dir": str(tmp_path)}
    model, opt = make()
    peer = Peer(model, opt, max_rounds=3, **settings)
    assert train(peer, model, opt) >= 12 and peer.exit_code == 0 and peer.round == 3
    theta = torch.cat([p.detach().flatten() for p in model.parameters()])
    moments = opt.state_dict()["state"][0]["exp_avg"].clone()
    model, opt = make()  # a new process would start from scratch like this
    again = Peer(model, opt, max_rounds=5, resume=True, **settings)
    again.start()
    try:
        assert again.round == 3  # where the first one stopped, θ and Adam's moments too
        resumed = torch.cat([p.detach().flatten() for p in model.parameters()])
        assert torch.equal(resumed, theta)
        assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], moments)
    finally:
        assert again.close() == 0


def test_a_torchrun_node_is_one_peer_whose_ranks_follow_rank_0(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """Two DDP ranks under torchrun (gloo) stand for one peer; a plain process is the other
    peer. Every rank ends with rank 0's θ, which the run mixed with the other peer's."""
    script = str(Path(__file__).with_name("replicas_script.py"))
    node = Daemon(
        [],
        reaper,
        "node",
        command=[
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", script, str(tmp_path / "node"),
        ],
    )  # fmt: skip
    address = node.wait_for(r"bootstrap address: (\S+)", 180).group(1)
    other = Daemon(
        [], reaper, "other", command=[sys.executable, script, str(tmp_path / "other"), address]
    )
    for proc in (node, other):
        assert proc.finish(300) == 0, proc.output()
    for name in ("node", "other"):
        rounds = summary_rounds(tmp_path / f"{name}.json")
        assert len(rounds) == 4 and all(r["exchanged"] == 1 for r in rounds)
    rank0, rank1 = (torch.load(tmp_path / f"node.rank{k}.pt") for k in (0, 1))
    assert torch.equal(rank0, rank1)  # the follower received every round's θ
    torch.manual_seed(0)  # the script's initialisation: training moved θ away from it
    init = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16))
    assert (
        float((rank0 - torch.cat([p.detach().flatten() for p in init.parameters()])).norm()) > 0.1
    )

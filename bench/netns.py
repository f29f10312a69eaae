"""A throwaway network of Linux namespaces with shaped links, for benches and multi-host tests.

``NetLab(n, rate_mbit=..., delay_ms=..., loss_pct=...)`` builds, as root, one *hub*
namespace holding a bridge and ``n`` *leaf* namespaces, each joined to the bridge by a veth
pair: a star, like n machines behind one switch, each with its own access link. Every
access link is shaped in both directions with ``tc`` (the leaf's side shapes its upload,
the hub's side its download): a token bucket (``tbf``) for the rate, under ``netem`` when
a delay is asked for; below 100 Mbit/s with GSO off and a 16 KiB bucket, so that a
message smaller than the bucket does not cross a slow link at once. Packet loss is an
nftables rule in each leaf that drops that share of its packets at random, in and out
(``numgen random``): it needs no ``netem``, which some kernels lack. Rates may differ per
leaf (a straggler's slow link).
Addresses are 10.231.<lab>.<i+1>/24 and exist only inside the namespaces, so nothing
reaches or shadows the host's own network. A leaf in ``nat`` is a home router instead: its
namespace holds that address and masquerades (nftables) for a host namespace behind it,
10.232.<lab>.2 on a private /24 of its own, which can dial out but takes no calls from
the other leaves (they have no route to it): a peer behind NAT. Everything is removed on
exit, also after an error or Ctrl-C (and ``cleanup_stale()`` removes leftovers of a killed
run by name).

    with NetLab(2, rate_mbit=1000) as lab:
        server = subprocess.Popen(lab.exec_argv(0, [sys.executable, "srv.py"]))
        client = subprocess.Popen(lab.exec_argv(1, [sys.executable, "cli.py", lab.address(0)]))

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2 (and nftables for loss);
:func:`available` and :func:`loss_available` say whether this machine allows it, and why
not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PREFIX = "gl"  # namespace and link names start with this (kept short: IFNAMSIZ is 16)
NFT_TABLE = "gaslocd_loss"
# Links slower than this are shaped packet by packet with a small bucket (see _shape);
# faster ones keep GSO (per-packet work at 1 Gbit/s would load the shared cores).
EXACT_BELOW_MBIT = 100.0
EXACT_BURST = 16 * 1024


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


def _run(ns: str, *argv: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        input=stdin,
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _tc(ns: str, *args: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, "tc", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )


def available() -> tuple[bool, str]:
    """Whether namespaces, veth and tc work here; the reason if not."""
    if os.geteuid() != 0:
        return False, "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"{tool} not found (apt-get install iproute2)"
    probe = f"{PREFIX}probe{os.getpid() % 10000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, "ok"


def _nft_probe(tag: str, attempt: Callable[[str], str | None]) -> tuple[bool, str]:
    """Run ``attempt`` in a scratch namespace: it returns why nftables failed, or None."""
    if shutil.which("nft") is None:
        return False, "nft not found (apt-get install nftables)"
    probe = f"{PREFIX}{tag}{os.getpid() % 10000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    try:
        why = attempt(probe)
        return (True, "ok") if why is None else (False, why)
    finally:
        _ip("netns", "del", probe, check=False)


def loss_available() -> tuple[bool, str]:
    """Whether random packet loss can be made here (nftables with ``numgen``); call it
    where :func:`available` said yes."""

    def attempt(ns: str) -> str | None:
        made = _drop_rules(ns, "lo", 1.0, check=False)
        return None if made.returncode == 0 else made.stderr.strip()

    return _nft_probe("loss", attempt)


def nat_available() -> tuple[bool, str]:
    """Whether a NAT router (nftables masquerade) can be made here; call it where
    :func:`available` said yes."""

    def attempt(ns: str) -> str | None:
        rules = "table ip t {\n chain c {\n type nat hook postrouting priority srcnat;\n }\n}\n"
        try:
            _run(ns, "nft", "-f", "-", stdin=rules)
        except subprocess.CalledProcessError as exc:
            return f"nftables NAT: {exc.stderr.strip()}"
        return None

    return _nft_probe("nat", attempt)


def _drop_rules(
    ns: str, dev: str, loss_pct: float, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Drop ``loss_pct`` % of the packets ``dev`` sends and receives, at random."""
    if not 0 < loss_pct < 100:
        raise ValueError(f"loss must be in (0, 100) %, got {loss_pct}")
    per_10k = round(loss_pct * 100)
    rules = (
        f"table inet {NFT_TABLE} {{\n"
        f"  chain inbound {{ type filter hook input priority 0; policy accept;\n"
        f'    iifname "{dev}" numgen random mod 10000 < {per_10k} counter drop; }}\n'
        f"  chain outbound {{ type filter hook output priority 0; policy accept;\n"
        f'    oifname "{dev}" numgen random mod 10000 < {per_10k} counter drop; }}\n'
        f"}}\n"
    )
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-f", "-"],
        input=rules,
        check=check,
        capture_output=True,
        text=True,
        timeout=30,
    )


def dropped_packets(ns: str) -> int:
    """Packets the loss rules of namespace ``ns`` dropped so far."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "inet", NFT_TABLE],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    words = out.split()
    return sum(int(words[i + 1]) for i, w in enumerate(words) if w == "packets")


def cleanup_stale() -> None:
    """Remove namespaces left by a killed run (they all start with ``PREFIX``)."""
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX) and name[len(PREFIX) :][:1].isdigit():
            _ip("netns", "del", name, check=False)


def _shape(ns: str, dev: str, rate_mbit: float | None, delay_ms: float) -> None:
    if rate_mbit is None and delay_ms == 0:
        return
    parent = ["root"]
    if delay_ms:
        netem = ["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "limit", "100000"]
        _tc(ns, *netem, "delay", f"{delay_ms}ms")
        parent = ["parent", "1:", "handle", "2:"]
    if rate_mbit is not None:
        # burst: ~4 ms of traffic and at least a 64 KiB GSO segment, else tbf drops them.
        burst = max(int(rate_mbit * 1e6 / 8 * 0.004), 256 * 1024)
        if rate_mbit < EXACT_BELOW_MBIT:
            # Such a bucket lets a whole small message through at once: over "1 Mbit/s"
            # 150 kB (a q4 θ̃ of the tiny model) arrived in 0.00 s and 600 kB at 1.36
            # Mbit/s, so a slow link's measured (and published) rate was inflated. Sent
            # one MTU per packet (GSO off), a small bucket is enough: 1.07 and 0.98 Mbit/s.
            _ip("link", "set", dev, "gso_max_segs", "1", "gso_max_size", "1500", ns=ns)
            burst = max(int(rate_mbit * 1e6 / 8 * 0.004), EXACT_BURST)
        _tc(
            ns,
            "qdisc",
            "add",
            "dev",
            dev,
            *parent,
            "tbf",
            "rate",
            f"{rate_mbit}mbit",
            "burst",
            str(burst),
            "latency",
            "50ms",
        )


@dataclass
class NetLab:
    """n leaf namespaces on a bridge; see the module docstring."""

    n: int
    rate_mbit: float | Sequence[float | None] | None = None
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    nat: frozenset[int] = frozenset()  # leaves behind a NAT router (see the module doc)
    lab: int = field(default_factory=lambda: os.getpid() % 200 + 1)
    _made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 250:
            raise ValueError(f"NetLab supports 1..250 namespaces, got {self.n}")
        rates = self.rate_mbit
        if rates is None or isinstance(rates, int | float):
            rates = [rates] * self.n
        if len(rates) != self.n:
            raise ValueError(f"{len(rates)} rates for {self.n} namespaces")
        self.rates: list[float | None] = list(rates)

    @property
    def hub(self) -> str:
        return f"{PREFIX}{self.lab}hub"

    def ns(self, i: int) -> str:
        """The name of leaf namespace ``i``."""
        return f"{PREFIX}{self.lab}n{i}"

    def host_ns(self, i: int) -> str:
        """Where leaf ``i``'s programs run: the leaf, or the host behind its NAT router."""
        return f"{PREFIX}{self.lab}p{i}" if i in self.nat else self.ns(i)

    def address(self, i: int) -> str:
        """The IPv4 address programs of leaf ``i`` bind to: reachable from the other leaves,
        or, behind NAT, from nowhere but its router."""
        return f"10.232.{self.lab}.2" if i in self.nat else self.public_address(i)

    def public_address(self, i: int) -> str:
        """Leaf ``i``'s address on the bridge (its router's, behind NAT)."""
        return f"10.231.{self.lab}.{i + 1}"

    def exec_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside leaf ``i`` (prefix it to a Popen argument list)."""
        return ["ip", "netns", "exec", self.host_ns(i), *argv]

    def __enter__(self) -> NetLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "del", name, check=False)
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("link", "set", "lo", "up", ns=name)

    def _build(self) -> None:
        self._add_ns(self.hub)
        _ip("link", "add", "br0", "type", "bridge", ns=self.hub)
        _ip("link", "set", "br0", "up", ns=self.hub)
        for i in range(self.n):
            leaf, host_end = self.ns(i), f"v{i}"
            self._add_ns(leaf)
            # create the pair inside the hub, then move one end into the leaf as eth0
            _ip("link", "add", host_end, "type", "veth", "peer", "name", f"l{i}", ns=self.hub)
            _ip("link", "set", f"l{i}", "netns", leaf, ns=self.hub)
            _ip("link", "set", f"l{i}", "name", "eth0", ns=leaf)
            _ip("addr", "add", f"{self.public_address(i)}/24", "dev", "eth0", ns=leaf)
            _ip("link", "set", "eth0", "up", ns=leaf)
            _ip("link", "set", host_end, "master", "br0", ns=self.hub)
            _ip("link", "set", host_end, "up", ns=self.hub)
            _shape(leaf, "eth0", self.rates[i], self.delay_ms)  # upload
            _shape(self.hub, host_end, self.rates[i], self.delay_ms)  # download
            if self.loss_pct:
                _drop_rules(leaf, "eth0", self.loss_pct)  # both directions, in the leaf
            if i in self.nat:
                self._behind_nat(i)

    def _behind_nat(self, i: int) -> None:
        """Leaf ``i`` becomes a router: a host namespace on a private /24 behind it, whose
        outgoing connections it masquerades as its own address."""
        router, host = self.ns(i), self.host_ns(i)
        self._add_ns(host)
        _ip("link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", host, ns=router)
        _ip("addr", "add", f"10.232.{self.lab}.1/24", "dev", "lan0", ns=router)
        _ip("link", "set", "lan0", "up", ns=router)
        _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=host)
        _ip("link", "set", "eth0", "up", ns=host)
        _ip("route", "add", "default", "via", f"10.232.{self.lab}.1", ns=host)
        _run(router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        rules = (
            "table ip gaslocd_nat {\n chain post {\n"
            "  type nat hook postrouting priority srcnat; policy accept;\n"
            '  oifname "eth0" masquerade\n }\n}\n'
        )
        _run(router, "nft", "-f", "-", stdin=rules)

    def close(self) -> None:
        """Delete every namespace made (their veths and qdiscs go with them)."""
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)

    def set_link(self, i: int, *, up: bool) -> None:
        """Cut (``up=False``) or restore leaf ``i``'s access link: a partition and its heal."""
        _ip("link", "set", "eth0", "up" if up else "down", ns=self.ns(i))

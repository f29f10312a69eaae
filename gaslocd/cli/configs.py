"""The frozen objects of :mod:`gaslocd.config`, filled from resolved settings.

Which setting fills which field is written once, in the table's ``fields``; here the
fields of one target are gathered and the object is built, so that its own checks turn a
wrong combination into one readable ``ValueError``. Only :func:`algo_config` has rules
of its own: defaults that depend on ``--algo``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from gaslocd.cli.settings import SETTINGS
from gaslocd.config import (
    AlgoConfig,
    DaemonConfig,
    OuterConfig,
    SimConfig,
    TrainConfig,
    WireConfig,
)

TARGETS = {
    "algo": AlgoConfig,
    "outer": OuterConfig,
    "train": TrainConfig,
    "daemon": DaemonConfig,
    "wire": WireConfig,
    "sim": SimConfig,
}

# Defaults that depend on --algo when the user did not set them (DiLoCo all-reduces over
# everyone; DAdam is H = 1 by definition).
_ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "gasloc": {},
    "diloco": {"topology": "complete"},
    "dadam": {"inner_steps": 1},
    "local-dadam": {},
}
_GOSSIP_ONLY = ("dadam", "local-dadam")


def config_fields(target: str, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of one config object from the settings the command has.

    A setting the command lacks is left out, so the object's own default applies.
    """
    kwargs: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.name not in resolved:
            continue
        for spec in setting.fields:
            owner, _, name = spec.partition(".")
            if owner == target:
                kwargs[name] = resolved[setting.name]
    return kwargs


def algo_config(resolved: Mapping[str, Any]) -> AlgoConfig:
    """The algorithm, with the defaults that follow from ``--algo`` filled in.

    Adaptation (of H, and of a link's codec) is a flag that turns it on for ``simulate``
    (``--adapt-h``, off unless asked, to compare with fixed settings) and one that turns
    it off for the daemons (``--no-adapt-h``: a real network should absorb stragglers).
    """
    kwargs = config_fields("algo", resolved)
    algo = kwargs.get("algo", "gasloc")
    implied = _ALGO_DEFAULTS[algo]
    for name, fallback in (("topology", "1peer"), ("inner_steps", 30)):
        if kwargs.get(name) is None:
            kwargs[name] = implied.get(name, fallback)
    for name in ("adapt_h", "adapt_codec"):
        if name in resolved:
            kwargs[name] = bool(resolved[name])
        else:
            kwargs[name] = not resolved.get(f"no_{name}", False)
    outer = {k: x for k, x in config_fields("outer", resolved).items() if x is not None}
    if algo in _GOSSIP_ONLY:
        if outer:
            raise ValueError(f"{algo} is gossip with η=1, μ=0; use --algo gasloc to set them")
        return AlgoConfig(**kwargs)
    return AlgoConfig(**kwargs, outer=OuterConfig(**outer))


def train_config(resolved: Mapping[str, Any]) -> TrainConfig:
    """The inner training; ``--lr-schedule auto`` decays over a bounded run's budget.

    The budget of a bounded run is its rounds times H_base (``--rounds`` for demo and
    simulate, ``--max-rounds`` for a daemon, whose absolute round count and checkpointed
    step count make a resumed daemon continue the same schedule).
    """
    kwargs = config_fields("train", resolved)
    schedule, total = resolved.get("lr_schedule", "constant"), resolved.get("total_steps")
    rounds = resolved.get("rounds") or resolved.get("max_rounds") or 0
    if total is None and schedule != "constant" and rounds:
        total = rounds * algo_config(resolved).resolved().inner_steps
    if schedule == "auto":  # a budget within the warm-up has nothing left to decay
        warmup = kwargs.get("warmup_steps", TrainConfig.warmup_steps)
        schedule = "cosine" if total and total > warmup else "constant"
    return TrainConfig(**kwargs, lr_schedule=schedule, total_steps=total)


def daemon_config(resolved: Mapping[str, Any]) -> DaemonConfig:
    """One daemon's identity, addresses, pacing and persistence."""
    return DaemonConfig(**config_fields("daemon", resolved))


def wire_config(resolved: Mapping[str, Any]) -> WireConfig:
    """Token and TLS (the rest of the wire keeps its tuned defaults)."""
    return WireConfig(**config_fields("wire", resolved))


def sim_config(resolved: Mapping[str, Any]) -> SimConfig:
    """The simulated network and clock."""
    return SimConfig(**config_fields("sim", resolved))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_open_port(resolved: Mapping[str, Any]) -> None:
    """A daemon (or library peer) that others can reach must need the run's credential."""
    if not resolved["token"] and not _is_loopback(resolved["host"]):
        raise ValueError(
            f"listening on {resolved['host']} without --token would let anyone who reaches "
            "this port send parameters into the run: set --token (or GASLOCD_TOKEN) on "
            "every peer"
        )

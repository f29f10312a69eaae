"""Stragglers whose link cannot carry the model within a round, on real daemons (issue 13).

    sudo .venv/bin/python bench/stragglers_net.py               # the committed run, ~35 min
    sudo .venv/bin/python bench/stragglers_net.py --quick       # smoke: 2 runs of 60 s, /tmp
    .venv/bin/python bench/stragglers_net.py --report-only      # rebuild the report

The harness of ``bench/network.py`` (one real daemon per network namespace of a
:class:`netns.NetLab`, a star of ``tc``-shaped access links, a fixed wall-clock per run),
with stragglers sized in rounds rather than as a share of the others' rate: a straggler
"at k×" has a link whose fp16 message of the model takes k × T, where T = H_base × the
daemons' step time is the round. T is calibrated on the first run, GASLoC with no
straggler (its measured step time; ``--step-time`` gives it instead), and every straggler
rate follows from it. The fast links are at ``--rate-mbit``, which carries fp16 in a small
part of a round. Runs:

* GASLoC with ``--overlap`` (adaptive H and a codec per link, the daemons' defaults: a
  slow link steps fp16 → int8 → q4; one that not even q4 crosses in a round becomes a
  long exchange, and its peer sits out of the pairings meanwhile);
* DiLoCo (``--algo diloco``, fixed H, hivemind's all-reduce, ``--codec``);
* with one straggler at each of ``--multiples`` (1×, 3×, 10×), two at ``--pair``
  (3× and 10×), and GASLoC with no straggler.

Each daemon's JSON summary gives its time account and evaluations, its ``/metrics``
(read at both ends of the measured window) the exchanges by codec and the long exchanges,
its log the sit-outs it announced; the namespaces' link counters give the bytes. The report
(``network_stragglers.md``, PNG plots, per-run JSON in ``network_stragglers/``) checks
issue 13's targets. The daemons run from a frozen copy of the ``gaslocd`` package taken
at the start (the tree may change while the bench runs); its identity is recorded.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netns
import network
from network import final_loss, host_shares, time_to, training_share

from gaslocd.protocol.account import ACTIVITIES
from gaslocd.protocol.linkcodec import message_bytes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STEM = "network_stragglers"
CODECS = ("fp32", "fp16", "bf16", "int8", "q4")

# Issue 13's targets.
VS_DILOCO = 0.6  # GASLoC's time to DiLoCo's final loss ÷ DiLoCo's, same stragglers
VS_NONE = 1.15  # GASLoC's time to the common target ÷ the no-straggler run's
TRAINING = 0.90  # each non-straggler host's training share


@dataclass(frozen=True)
class Straggle:
    """One run: ``algo`` with stragglers whose fp16 transfer is ``multiples`` × T (the
    first on the last host, the next on the one before, ...; never the bootstrap peer)."""

    algo: str  # gasloc | diloco
    multiples: tuple[float, ...] = ()

    @property
    def tag(self) -> str:
        return "-".join(f"{m:g}x" for m in self.multiples) or "none"

    @property
    def name(self) -> str:
        return f"{self.algo}-{self.tag}"

    @property
    def label(self) -> str:
        what = {"gasloc": "GASLoC overlap", "diloco": "DiLoCo"}[self.algo]
        if not self.multiples:
            return f"{what}, no straggler"
        where = " and ".join(f"{m:g}×" for m in self.multiples)
        return f"{what}, straggler{'s' if len(self.multiples) > 1 else ''} at {where} T"

    def slow_hosts(self, n: int) -> list[int]:
        """The straggling hosts, in the order of ``multiples``."""
        if len(self.multiples) > n - 1:
            raise ValueError(f"{len(self.multiples)} stragglers need more than {n} hosts")
        return [n - 1 - k for k in range(len(self.multiples))]


def scenarios(multiples: Sequence[float], pair: Sequence[float]) -> list[Straggle]:
    """GASLoC with no straggler first (it calibrates T), then GASLoC and DiLoCo with one
    straggler at each multiple, then with the stragglers of ``pair`` together."""
    out = [Straggle("gasloc")]
    groups = [(m,) for m in multiples] + ([tuple(pair)] if pair else [])
    for g in groups:
        out += [Straggle("gasloc", g), Straggle("diloco", g)]
    return out


# -- analysis: pure functions (tested in tests/bench/test_stragglers_analysis.py) ---------


def step_time(hosts: Sequence[dict[str, Any]]) -> float:
    """The daemons' step time: per host its training seconds (train + fill) over the inner
    steps of the measured window's rounds; the median over hosts (as the daemons' T takes
    the median of the published step times)."""
    per_host = [
        (h["time_s"]["train"] + h["time_s"]["fill"]) / sum(h["h"]) for h in hosts if sum(h["h"])
    ]
    if not per_host:
        raise ValueError("no inner steps measured")
    return statistics.median(per_host)


def link_rate_mbit(numel: int, codec: str, seconds: float) -> float:
    """The rate (Mbit/s) at which one ``codec`` message of ``numel`` values takes
    ``seconds``."""
    return message_bytes(codec, numel) * 8 / seconds / 1e6


def host_rates(
    sc: Straggle,
    n: int,
    fast_mbit: float,
    numel: int,
    codec: str,
    round_s: float,
    control_mbit: float = 0.0,
) -> list[float]:
    """Each host's link rate: ``fast_mbit``, and a straggler at k× a rate whose ``codec``
    message takes k rounds of ``round_s``, plus ``control_mbit`` for the DHT's own traffic
    (``--control-mbit``): at the bench's model size it took most of a 10× link, which then
    moved θ̃ at 30× and more."""
    rates = [fast_mbit] * n
    for host, m in zip(sc.slow_hosts(n), sc.multiples, strict=True):
        rates[host] = link_rate_mbit(numel, codec, m * round_s) + control_mbit
    return rates


def _wire(host: dict[str, Any]) -> str:
    """The θ̃ bytes a host sent in the window (MiB), or '?' for runs made before they
    were recorded."""
    return _mib(host["wire_sent"]) if "wire_sent" in host else "?"


def control_mbit(hosts: Sequence[dict[str, Any]], duration_s: float) -> float:
    """What a daemon sends besides θ̃ (Mbit/s): per host its link's bytes over the window
    less the wire's (``wire_sent``: ``gasloc_bytes_sent_total`` grown between the two
    scrapes); the median over hosts."""
    rates = [max(0, h["sent_bytes"] - h["wire_sent"]) * 8 / duration_s / 1e6 for h in hosts]
    return statistics.median(rates)


def common_target(curve: Sequence[tuple[float, float]], duration_s: float, at: float) -> float:
    """A loss every GASLoC run can be timed to: the reference curve's value at ``at`` of
    its run (the mean of its last three points by then; one evaluation is noisy)."""
    return final_loss([p for p in curve if p[0] <= at * duration_s])


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str | None) -> dict[str, dict[str, float]]:
    """Prometheus text → family → {its label values in the order of their names, joined
    by '/' ('' if none): value}."""
    out: dict[str, dict[str, float]] = {}
    for line in (text or "").splitlines():
        m = _METRIC.match(line)
        if m is None or line.startswith("#"):
            continue
        name, labels, value = m.groups()
        label = "/".join(v for _, v in sorted(re.findall(r'(\w+)="([^"]*)"', labels or "")))
        try:
            out.setdefault(name, {})[label] = float(value)
        except ValueError:
            continue
    return out


def counter_delta(before: str | None, after: str | None, family: str) -> dict[str, int]:
    """How much each label of counter ``family`` grew between two scrapes (zeros left
    out; a family absent before counts from zero)."""
    b, a = parse_metrics(before).get(family, {}), parse_metrics(after).get(family, {})
    grown = {k: round(v - b.get(k, 0.0)) for k, v in a.items()}
    return {k: v for k, v in sorted(grown.items()) if v}


_SIT_OUT = re.compile(
    r"round (\d+): our link needs (\d+) rounds per exchange; "
    r"paired every \d+ rounds from round (\d+)"
)


def sit_outs(log: str) -> list[tuple[int, int, int]]:
    """The sit-out schedules a daemon announced: (round, rounds per exchange, first round
    paired)."""
    return [(int(a), int(k), int(u)) for a, k, u in _SIT_OUT.findall(log)]


def log_trouble(log: str, context: int = 6) -> list[str]:
    """Excerpts of a daemon log around each traceback (the lines before, to the end of
    the exception)."""
    lines = log.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                j += 1
            out.append("\n".join(lines[max(0, i - context) : j + 1]))
            i = j + 1
        else:
            i += 1
    return out


def exit_lines(logs: dict[str, str]) -> str:
    """The last line of each log that ends in an error (a daemon that gave up), joined."""
    out = []
    for name, text in logs.items():
        lines = [x for x in text.splitlines() if x.strip()]
        last = lines[-1] if lines else ""
        if "cannot start" in last or "Error" in last or "Traceback" in last:
            out.append(f"{name}: {last.strip()}")
    return "; ".join(out)


def window_rounds(rounds: Sequence[dict[str, Any]], t0: float, t1: float) -> list[dict]:
    return [r for r in rounds if t0 <= r["unix_time"] <= t1]


def sat_out(rounds: Sequence[dict[str, Any]]) -> int:
    """Rounds a daemon was outside the pairing (its roster only itself, with others about)."""
    return sum(1 for r in rounds if len(r.get("roster", ())) == 1)


def ratio(t: float | None, other: float | None, other_span: float) -> tuple[float | None, str]:
    """t / other and its text; an upper bound (``< x``) when only the other never got
    there (then its whole run is the bound); None when t never got there."""
    if t is None:
        return None, "—"
    if other is None:
        bound = t / other_span
        return bound, f"< {bound:.2f}×"
    return t / other, f"{t / other:.2f}×"


def diloco_reference(d: dict[str, Any] | None) -> dict[str, Any]:
    """The loss GASLoC is timed to against DiLoCo run ``d``, and DiLoCo's time to it.

    Normally DiLoCo's final loss (the mean of the last three points of its network-mean
    curve) and the first time that curve is at or below it. That curve starts only once
    every host has evaluated; when it is empty (a straggler never evaluated in the window)
    the most favourable reading for DiLoCo instead (``fallback``): the lowest loss any of
    its hosts' evaluations reached (they hold the same averaged model after each
    all-reduce; a lagging host's higher value is passed over), timed at the first
    evaluation anywhere at or below it. ``evaluated`` of ``hosts`` hosts evaluated; loss
    NaN and time None where there is nothing to read."""
    if d is None:
        return {"loss": math.nan, "t": None, "fallback": False, "evaluated": 0, "hosts": 0}
    hosts = d["hosts"]
    out = {"evaluated": sum(1 for h in hosts if h.get("evals")), "hosts": len(hosts)}
    if d["curve"]:
        loss = final_loss(d["curve"])
        return {**out, "loss": loss, "t": time_to(d["curve"], loss), "fallback": False}
    points = sorted((t, loss) for h in hosts for t, loss in h.get("evals", []))
    loss = min((x for _, x in points), default=math.nan)
    return {**out, "loss": loss, "t": time_to(points, loss), "fallback": True}


def reference_name(ref: dict[str, Any]) -> str:
    """What :func:`diloco_reference`'s loss is, in the report's words."""
    if not ref.get("fallback"):
        return "DiLoCo's final loss"
    return f"DiLoCo's best single-host loss ({ref['evaluated']} of {ref['hosts']} hosts evaluated)"


def verdicts(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per target and straggler group, from the report's rows (each a GASLoC run
    with ``diloco_final``, ``diloco_ref`` (:func:`diloco_reference`), ``vs_diloco``,
    ``vs_none`` (value, text, reached) and ``fast_min``)."""
    out = []
    for row in rows:
        v, text, _ = row["vs_diloco"]
        name = reference_name(row.get("diloco_ref", {}))
        if math.isnan(row["diloco_final"]):
            what = "not decided: no DiLoCo reference (no DiLoCo run or none of its hosts evaluated)"
        elif v is None:
            what = f"not met: GASLoC never reached {name}"
        elif text.startswith("<") and v > VS_DILOCO:
            what = "not decided: DiLoCo never reached its own final value again"
        else:
            what = "met" if v <= VS_DILOCO else "not met"
        tag = row["tag"]
        out.append(f"- {tag}: GASLoC ÷ DiLoCo to {name} {text} (≤ {VS_DILOCO}: {what}).")
        v, text, _ = row["vs_none"]
        what = "not met: never reached" if v is None else ("met" if v <= VS_NONE else "not met")
        out.append(
            f"- {tag}: GASLoC ÷ GASLoC without straggler to the common target {text} "
            f"(≤ {VS_NONE}: {what})."
        )
        share = row["fast_min"]
        out.append(
            f"- {row['tag']}: lowest training share of a non-straggler host {share:.1%} "
            f"(≥ {TRAINING:.0%}: {'met' if share >= TRAINING else 'not met'})."
        )
    return out


# -- running -------------------------------------------------------------------------------


def snapshot_code(dest: Path) -> dict[str, Any]:
    """Copy the ``gaslocd`` package the bench imports to ``dest/gaslocd`` (the daemons run
    from it) and say what it is: the commit, the files that differ from it, a digest."""
    import gaslocd

    src = Path(gaslocd.__file__).resolve().parent
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest / "gaslocd", ignore=shutil.ignore_patterns("__pycache__"))
    files = sorted(p for p in (dest / "gaslocd").rglob("*") if p.is_file())
    digest = hashlib.sha256()
    blobs = {}
    for f in files:
        rel = f.relative_to(dest).as_posix()
        data = f.read_bytes()
        digest.update(rel.encode() + b"\0" + data)
        blobs[rel] = git_blob_sha(data)
    head = _git("rev-parse", "--short", "HEAD")
    tracked = {}  # path -> blob sha at HEAD ("<mode> blob <sha>\t<path>" per line)
    for line in _git("ls-tree", "-r", "HEAD", "gaslocd").splitlines():
        info, path = line.split("\t", 1)
        tracked[path] = info.split()[2]
    changed = sorted(p for p, sha in blobs.items() if tracked.get(p) != sha)
    changed += sorted(f"{p} (deleted)" for p in tracked if p not in blobs)
    return {"commit": head, "changed": changed, "digest": digest.hexdigest()[:16]}


def git_blob_sha(data: bytes) -> str:
    """What ``git hash-object`` says of a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's own digest


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return out.stdout.strip()


def run_one(
    sc: Straggle,
    args: argparse.Namespace,
    rates: list[float],
    code: Path,
    work: Path,
) -> dict[str, Any]:
    """One run; its data, with codecs, long exchanges and sit-outs per host."""
    n = args.workers
    flags = ["--algo", sc.algo]
    if sc.algo == "gasloc":
        flags.append("--overlap")  # adaptive H and codec per link: the daemons' defaults
    else:
        flags.append("--no-adapt-h")  # DiLoCo as published: the same H everywhere
    fleet = network.Fleet(
        name=sc.name,
        rates=list(rates),
        slow=frozenset(sc.slow_hosts(n)),
        flags=flags,
        duration_s=args.durations.get(sc.name, args.duration),
        metrics_port=args.metrics_port,
        env={"PYTHONPATH": str(code)},
        cwd=code,
    )
    load = os.getloadavg()[0]
    result = network.run_fleet(fleet, args, work)
    for i, host in enumerate(result["hosts"]):
        summary = json.loads((work / f"host{i}.json").read_text())
        log = (work / f"host{i}.log").read_text(errors="replace")
        inside = window_rounds(summary["rounds"], result["t0"], result["t1"])
        before, after = host.pop("metrics", [None, None])
        host.update(
            {
                "multiple": dict(zip(sc.slow_hosts(n), sc.multiples, strict=True)).get(i),
                "sat_out_rounds": sat_out(inside),
                "sit_outs": sit_outs(log),
                "codecs": counter_delta(before, after, "gasloc_exchanges_by_codec_total"),
                "long": counter_delta(before, after, "gasloc_long_exchanges_total"),
                "roster_reads": counter_delta(before, after, "gasloc_roster_reads_total"),
                "dht_reads": counter_delta(before, after, "gasloc_dht_reads_total"),
                "dht_rpc": counter_delta(before, after, "gasloc_dht_rpc_bytes_total"),
                "dht_rpc_calls": counter_delta(before, after, "gasloc_dht_rpcs_total"),
                "wire_sent": counter_delta(before, after, "gasloc_bytes_sent_total").get("", 0),
                "metrics_read": before is not None and after is not None,
                "exchanged": sum(r["exchanged"] for r in inside),
                "partners": sum(r["partners"] for r in inside),
                "tracebacks": log_trouble(log),
            }
        )
    return {
        "scenario": sc.name,
        "label": sc.label,
        "algo": sc.algo,
        "tag": sc.tag,
        "multiples": list(sc.multiples),
        "load_before": load,
        "load_after": os.getloadavg()[0],
        **result,
    }


# -- report -------------------------------------------------------------------------------


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def _time_text(t: float | None, run: dict[str, Any]) -> str:
    return f"{t:.0f} s" if t is not None else f"> {run['duration_s']:.0f} s"


def _loss_text(loss: float) -> str:
    return "—" if math.isnan(loss) else f"{loss:.4f}"


def _reference_text(ref: dict[str, Any]) -> str:
    """The table's cell for :func:`diloco_reference`: its loss, and the fallback named."""
    text = _loss_text(ref["loss"])
    if ref["fallback"] and not math.isnan(ref["loss"]):
        text += f" (best single host; {ref['evaluated']} of {ref['hosts']} hosts evaluated)"
    return text


def _fallback_text(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The targets' note on the DiLoCo runs whose network-mean curve is empty."""
    runs = [r for r in rows if r.get("diloco_ref", {}).get("fallback")]
    if not runs:
        return []
    which = ", ".join(
        f"diloco-{r['tag']} ({r['diloco_ref']['evaluated']} of {r['diloco_ref']['hosts']} "
        "hosts evaluated)"
        for r in runs
    )
    return [
        "",
        f"Not every DiLoCo host evaluated within the window in {which}: a straggler had no "
        "evaluation, so the network-mean curve, which starts once every host has one, is "
        "empty and DiLoCo has no final loss. The reference there is instead **DiLoCo's best "
        "single-host loss**, the lowest loss any DiLoCo host's evaluation reached (its hosts "
        "hold the same averaged model after each all-reduce), with DiLoCo's time to it the "
        "first evaluation of any of its hosts at or below it: a reading more favourable to "
        "DiLoCo than a network mean would be (the lowest single evaluation, with no lagging "
        "host's value averaged in). GASLoC is still timed on its own network-mean curve.",
    ]


def _codec_text(hosts: Sequence[dict[str, Any]]) -> str:
    total: dict[str, int] = {}
    for h in hosts:
        for k, v in h.get("codecs", {}).items():
            total[k] = total.get(k, 0) + v
    return " ".join(f"{k} {total[k]}" for k in CODECS if k in total) or "—"


def analyse(runs: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the report: targets and, per GASLoC run, its ratios."""
    by_name = {r["scenario"]: r for r in runs}
    base = by_name.get("gasloc-none")
    common = (
        common_target(base["curve"], base["duration_s"], meta["common_at"]) if base else math.nan
    )
    t_base = time_to(base["curve"], common) if base else None
    rows = []
    for r in runs:
        if r["algo"] != "gasloc" or not r["multiples"]:
            continue
        d = by_name.get(f"diloco-{r['tag']}")
        ref = diloco_reference(d)
        target = ref["loss"]
        t = time_to(r["curve"], target) if d else None
        t_d = ref["t"]
        vs_d = ratio(t, t_d, d["duration_s"]) if d else (None, "—")
        t_c = time_to(r["curve"], common) if base else None
        vs_n = ratio(t_c, t_base, base["duration_s"]) if base else (None, "—")
        fast = [training_share(h) for h in r["hosts"] if not h["straggler"]]
        rows.append(
            {
                "tag": r["tag"],
                "run": r["scenario"],
                "diloco_final": target,
                "diloco_ref": ref,
                "t_gasloc": t,
                "t_diloco": t_d,
                "vs_diloco": (*vs_d, t is not None),
                "t_common": t_c,
                "vs_none": (*vs_n, t_c is not None),
                "fast_min": min(fast) if fast else math.nan,
            }
        )
    return {"common": common, "t_base": t_base, "rows": rows}


def write_report(runs: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> str:
    numbers = analyse(runs, meta)
    rows = {row["run"]: row for row in numbers["rows"]}
    cal = meta["calibration"]
    code = meta["code"]
    lines = [
        "# Stragglers slower than a round: GASLoC (overlap) vs DiLoCo with real daemons (issue 13)",
        "",
        "Commands: " + "; ".join(f"`{c}`" for c in meta["commands"]) + "  ",
        f"Machine: {meta['machine']}  ",
        f"Date: {meta['date']}  ",
        f"Code: the daemons ran from a copy of `gaslocd` taken when the bench started: commit "
        f"{code['commit']}"
        + (
            f" with uncommitted changes in {len(code['changed'])} files "
            f"({', '.join(c.removeprefix('gaslocd/') for c in code['changed'])})"
            if code["changed"]
            else ""
        )
        + f", digest {code['digest']}.  ",
        f"Setup: {meta['workers']} daemons, one per network namespace (`bench/netns.py`), "
        f"access links shaped with `tc tbf` both ways: {meta['rate_mbit']:g} Mbit/s (fp16 "
        f"message in {meta['fast_fp16_s']:.2f} s, {meta['fast_fp16_s'] / cal['round_s']:.0%} "
        f"of T), stragglers as below; model `{meta['model']}` ({meta['numel']:,} params, "
        f"fp16 message {_mib(meta['fp16_bytes'])} MiB), `--codec {meta['codec']}`, H_base "
        f"{meta['inner_steps']}, seq {meta['seq_len']} × batch {meta['batch_size']}, "
        f"validation every {meta['eval_every']} rounds on {meta['eval_batches']} batches; "
        f"{meta['duration']:g} s of training per run (the window starts once every daemon "
        f"has begun rounds). GASLoC: `--overlap`, adaptive H and codec per link (defaults); "
        f"DiLoCo: `--algo diloco --no-adapt-h`. All daemons share this machine's CPU cores.",
        "",
        f"Round time T = H_base × step time = {meta['inner_steps']} × {cal['step_s']:.4f} s = "
        f"**{cal['round_s']:.2f} s**, {cal['source']}. A straggler at k× has the link on "
        f"which one fp16 message takes k·T"
        + (
            f", plus {meta['control_mbit']:g} Mbit/s for the DHT's own traffic (a sitting "
            "peer's record publishes and the roster reads it serves, measured on four DHT "
            "nodes in namespaces: at this model size it would otherwise take half a 10× link)"
            if meta.get("control_mbit")
            else ""
        )
        + (
            f"; a fast host sent {meta['fast_control_mbit']:.3f} Mbit/s besides θ̃ (its "
            "reads every round and its θ̃'s packet headers included); the per-host table "
            "gives each host's θ̃ bytes beside its link's"
            if meta.get("fast_control_mbit")
            else ""
        )
        + ": "
        + ", ".join(f"{m:g}× → {rate:.3f} Mbit/s" for m, rate in meta["straggler_rates"])
        + ".",
        "",
        f"Targets: DiLoCo's final loss with the same stragglers (mean of its last three "
        f"network-mean values); the common target **{numbers['common']:.4f}** is GASLoC "
        f"without straggler's value at {meta['common_at']:.0%} of its run (mean of its last "
        f"three points by then), reached by it at "
        f"{_time_text(numbers['t_base'], _by(runs, 'gasloc-none'))}.",
        *_fallback_text(numbers["rows"]),
        "",
        "| run | stragglers | final loss | DiLoCo's final | time to it | GASLoC ÷ DiLoCo "
        "| time to common | ÷ no straggler | training share, fast hosts (min) "
        "| straggler training share | codecs sent (all hosts) | long exchanges landed/failed "
        "| sit-out rounds (straggler) | rounds (median) | MiB sent per host |",
        "| --- |" + " --- |" * 14,
    ]
    by_name = {r["scenario"]: r for r in runs}
    for r in runs:
        hosts = r["hosts"]
        row = rows.get(r["scenario"])
        d = by_name.get(f"diloco-{r['tag']}")
        ref = diloco_reference(d)
        target = ref["loss"]
        t = (ref["t"] if r is d else time_to(r["curve"], target)) if d else None
        t_c = time_to(r["curve"], numbers["common"]) if r["algo"] == "gasloc" else None
        slow = [h for h in hosts if h["straggler"]]
        fast = [training_share(h) for h in hosts if not h["straggler"]]
        long = [sum(h.get("long", {}).get(k, 0) for h in hosts) for k in ("landed", "failed")]
        rounds = sorted(h["rounds"] for h in hosts)[len(hosts) // 2]
        sent = [h["sent_bytes"] for h in hosts]
        lines.append(
            f"| {r['label']} | "
            + (", ".join(f"host {h['host']} {h['rate_mbit']:.3f} Mbit/s" for h in slow) or "—")
            + f" | {_loss_text(final_loss(r['curve']))} | {_reference_text(ref)}"
            f" | {_time_text(t, r) if d else '—'} | {row['vs_diloco'][1] if row else '—'}"
            f" | {_time_text(t_c, r) if r['algo'] == 'gasloc' else '—'}"
            f" | {row['vs_none'][1] if row else '—'}"
            f" | {min(fast):.1%} | "
            + (", ".join(f"{training_share(h):.1%}" for h in slow) or "—")
            + f" | {_codec_text(hosts)} | {long[0]}/{long[1]} | "
            + (", ".join(str(h["sat_out_rounds"]) for h in slow) or "—")
            + f" | {rounds} | {_mib(min(sent))}–{_mib(max(sent))} |"
        )
    lines += ["", "Targets (issue 13), from the numbers above:", "", *verdicts(numbers["rows"])]
    trouble = [
        (r["scenario"], h["host"], tb)
        for r in runs
        for h in r["hosts"]
        for tb in h.get("tracebacks", [])
    ]
    killed = [(r["scenario"], r.get("killed", [])) for r in runs if r.get("killed")]
    failed = [r for r in meta.get("failed", [])]
    lines += ["", "Daemon health:", ""]
    lines.append(
        f"- tracebacks in host logs: {len(trouble)}"
        + ("" if not trouble else " (" + ", ".join(f"{s} host {h}" for s, h, _ in trouble) + ")")
    )
    lines.append(
        "- daemons that needed SIGKILL after SIGTERM: "
        + (", ".join(f"{s} hosts {k}" for s, k in killed) or "none")
    )
    self_slow = [
        f"{r['scenario']} host {h['host']}"
        for r in runs
        for h in r["hosts"]
        if not h["straggler"] and h.get("sit_outs")
    ]
    lines.append(
        "- fast hosts that announced a sit-out (their own link judged too slow): "
        + (", ".join(self_slow) or "none")
    )
    lines.append(
        "- runs that failed: "
        + ("; ".join(f"{f['scenario']}: {f['error']}" for f in failed) or "none")
    )
    if meta.get("notes"):
        lines += ["", "Notes:", "", *(f"- {n}" for n in meta["notes"])]
    lines += ["", *_host_table(runs)]
    lines += _dht_rpc_table(runs)
    lines += [
        "",
        "Training share: `train` and `fill` (inner steps) over the accounted wall-clock of "
        "the rounds that ended in the measured window, from each daemon's per-round time "
        "account (docs/design.md §4). Codecs sent: the daemons' "
        "`gasloc_exchanges_by_codec_total` grown over the window (our θ̃ per partner and "
        "round, by the codec chosen for that link). Long exchanges: "
        "`gasloc_long_exchanges_total{outcome}` grown over the window, summed over both "
        "ends. Sit-out rounds: the straggler's rounds in the window outside the pairing "
        "(its round record's roster is only itself); the sit-outs it announced are in the "
        "per-host table. MiB sent: the namespace's link counter over the window, DHT and "
        "hivemind traffic included. Refused messages / failed exchanges per run: "
        + ", ".join(
            f"{r['scenario']} {sum(h['refused'] for h in r['hosts'])}/"
            f"{sum(h['failures'] for h in r['hosts'])}"
            for r in runs
        )
        + ".",
        "",
        f"![loss]({STEM}_loss.png)",
        f"![hosts]({STEM}_hosts.png)",
        f"![bytes]({STEM}_bytes.png)",
        "",
    ]
    _plots(runs, numbers, out)
    return "\n".join(lines)


def _by(runs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((r for r in runs if r["scenario"] == name), {"duration_s": math.nan})


def _host_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "Per host (stragglers marked with their multiple of T): time by activity as a share "
        "of the accounted wall-clock, mean H, codecs, long exchanges, announced sit-outs "
        "(round → first paired round: a schedule; before 835a8ba each cycle's round → until), "
        "exchanges done / planned, roster reads a round took prefetched / quick / waited for "
        "at its start (`gasloc_roster_reads_total`; quick since 694cd3d; — before it existed), "
        "and the DHT reads the host made, full (asking every node) / quick "
        "(`gasloc_dht_reads_total`, since it existed):",
        "",
        "| run | host | training | "
        + " | ".join(ACTIVITIES)
        + " | H | codecs sent | long landed/failed | sit-outs | exchanged | MiB sent (θ̃)/recv "
        "| rosters prefetched/quick/waited | DHT reads full/quick |",
        "| --- | --- |" + " ---: |" * (len(ACTIVITIES) + 1) + " --- |" * 8,
    ]
    for r in runs:
        for h in r["hosts"]:
            shares = host_shares(h) or {}
            mark = f" ({h['multiple']:g}×)" if h.get("multiple") else ""
            notes = h.get("sit_outs", [])
            sits = (
                ", ".join(f"{a}→{u}" for a, _, u in notes[:4])
                + (f" … ({len(notes)})" if len(notes) > 4 else "")
                or "—"
            )
            long = h.get("long", {})
            reads = h.get("roster_reads", {})
            rosters = (
                f"{reads.get('prefetched', 0)}/{reads.get('quick', 0)}/"
                f"{reads.get('at_round_start', 0)}"
                if reads
                else "—"
            )
            dht = h.get("dht_reads", {})
            dht_text = f"{dht.get('full', 0)}/{dht.get('quick', 0)}" if dht else "—"
            lines.append(
                f"| {r['scenario']} | {h['host']}{mark} | {training_share(h):.1%} | "
                + " | ".join(f"{shares.get(a, 0.0):.1%}" for a in ACTIVITIES)
                + f" | {h['mean_h']:.0f} | {_codec_text([h])} "
                f"| {long.get('landed', 0)}/{long.get('failed', 0)} | {sits} "
                f"| {h.get('exchanged', 0)}/{h.get('partners', 0)} "
                f"| {_mib(h['sent_bytes'])} ({_wire(h)})/{_mib(h['received_bytes'])} "
                f"| {rosters} | {dht_text} |"
            )
    return lines


# What each kind of DHT RPC is to a host: (rpc, side) -> its name in the table.
DHT_RPC_PARTS = {
    ("store", "called"): "our publishes",
    ("store", "served"): "stores to us",
    ("find", "served"): "reads we answered",
    ("find", "called"): "our reads",
    ("ping", "served"): "pings",
    ("ping", "called"): "pings",
}


def _by_part(counts: dict[str, int]) -> dict[str, int]:
    """Counter labels (values by label name, ending in rpc/side) summed by what they were for."""
    out: dict[str, int] = {}
    for label, n in counts.items():
        part = DHT_RPC_PARTS.get(tuple(label.split("/")[-2:]), "other")
        out[part] = out.get(part, 0) + n
    return out


def dht_rpc_kib(h: dict[str, Any]) -> dict[str, float]:
    """A host's DHT RPC bytes in the window (``gasloc_dht_rpc_bytes_total``, both
    directions) by what they were for, in KiB; {} before the metric existed."""
    return {part: n / 1024 for part, n in _by_part(h.get("dht_rpc", {})).items()}


def dht_rpc_calls(h: dict[str, Any]) -> dict[str, int]:
    """A host's DHT RPCs in the window by what they were for (``gasloc_dht_rpcs_total``)."""
    return _by_part(h.get("dht_rpc_calls", {}))


def _dht_rpc_table(runs: list[dict[str, Any]]) -> list[str]:
    """Per host of the GASLoC runs: what its DHT node's RPCs carried (message bytes,
    sent and received, without libp2p's framing) beside all it sent and received."""
    parts = list(dict.fromkeys(DHT_RPC_PARTS.values()))
    rows = [(r, h) for r in runs if r["algo"] == "gasloc" for h in r["hosts"] if h.get("dht_rpc")]
    if not rows:
        return []
    lines = [
        "",
        "DHT RPCs by what they carried (`gasloc_dht_rpc_bytes_total` grown over the window, "
        "KiB sent + received, protobuf messages without libp2p framing, encryption or "
        "p2pd's own traffic; in brackets the RPCs, `gasloc_dht_rpcs_total`, where "
        "recorded), beside the host's whole link (sent + received):",
        "",
        "| run | host | " + " | ".join(parts) + " | DHT total | link total |",
        "| --- | --- |" + " ---: |" * (len(parts) + 2),
    ]
    for r, h in rows:
        kib, calls = dht_rpc_kib(h), dht_rpc_calls(h)
        mark = f" ({h['multiple']:g}×)" if h.get("multiple") else ""
        link = (h["sent_bytes"] + h["received_bytes"]) / 1024
        lines.append(
            f"| {r['scenario']} | {h['host']}{mark} | "
            + " | ".join(
                f"{kib.get(p, 0.0):.0f}" + (f" ({calls.get(p, 0)})" if calls else "") for p in parts
            )
            + f" | {sum(kib.values()):.0f} | {link:.0f} |"
        )
    return lines


def _plots(runs: list[dict[str, Any]], numbers: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = list(dict.fromkeys(r["tag"] for r in runs if r["multiples"]))
    base = next((r for r in runs if r["scenario"] == "gasloc-none"), None)
    cols = max(1, min(2, len(tags)))
    rows_n = max(1, math.ceil(len(tags) / cols))
    fig, axes = plt.subplots(rows_n, cols, figsize=(6 * cols, 4 * rows_n), squeeze=False)
    for k, tag in enumerate(tags or ["none"]):
        ax = axes[k // cols][k % cols]
        for r in runs:
            if r["tag"] != tag or not r["curve"]:
                continue
            t, loss = zip(*r["curve"], strict=True)
            ax.plot(t, loss, "-" if r["algo"] == "gasloc" else "--", label=r["label"])
        if base is not None and base["curve"] and tag != "none":
            t, loss = zip(*base["curve"], strict=True)
            ax.plot(t, loss, ":", color="grey", label=base["label"])
        row = next((x for x in numbers["rows"] if x["tag"] == tag), None)
        if row is not None and not math.isnan(row["diloco_final"]):
            ref = row["diloco_ref"]
            ax.axhline(row["diloco_final"], color="C1", lw=0.6, ls="-." if ref["fallback"] else "-")
            if ref["fallback"]:  # no DiLoCo curve: mark where its best single host got there
                ax.plot([ref["t"]], [ref["loss"]], "o", color="C1", label=reference_name(ref))
        if not math.isnan(numbers["common"]):
            ax.axhline(numbers["common"], color="grey", lw=0.6, ls=":")
        ax.set_title(f"stragglers: {tag}")
        ax.set_xlabel("wall-clock s")
        ax.set_ylabel("network-mean validation loss")
        ax.legend(fontsize=7)
    for k in range(len(tags), rows_n * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(out / f"{STEM}_loss.png", dpi=110)
    plt.close(fig)

    names = [r["scenario"] for r in runs]
    n = max((len(r["hosts"]) for r in runs), default=0)
    width = 0.8 / max(n, 1)
    for what, stem, title in (
        ("share", "hosts", "training share per host (hatched: straggler)"),
        ("bytes", "bytes", "MiB sent (solid) and received (light) per host"),
    ):
        fig, ax = plt.subplots(figsize=(11, 4.5))
        for i in range(n):
            xs = [k + i * width for k in range(len(runs))]
            hosts = [r["hosts"][i] for r in runs]
            if what == "share":
                ys = [training_share(h) for h in hosts]
                bars = ax.bar(xs, ys, width, color=f"C{i}", label=f"host {i}")
            else:
                ys = [h["sent_bytes"] / 2**20 for h in hosts]
                bars = ax.bar(xs, ys, width / 2, color=f"C{i}", label=f"host {i}")
                ax.bar(
                    [x + width / 2 for x in xs],
                    [h["received_bytes"] / 2**20 for h in hosts],
                    width / 2,
                    color=f"C{i}",
                    alpha=0.4,
                )
            for bar, h in zip(bars, hosts, strict=True):
                if h["straggler"]:
                    bar.set_hatch("//")
        if what == "share":
            ax.axhline(TRAINING, color="grey", lw=0.8)
            ax.set_ylim(0, 1)
        else:
            ax.set_ylabel("MiB over the window")
        ax.set_xticks(
            [k + 0.4 - width / 2 for k in range(len(runs))], names, rotation=30, ha="right"
        )
        ax.set_title(title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_{stem}.png", dpi=110)
        plt.close(fig)


# -- main ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 runs of 60 s (smoke), to /tmp")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate-mbit", type=float, default=40.0, help="the fast links' rate")
    p.add_argument("--multiples", type=float, nargs="*", default=[1.0, 3.0, 10.0])
    p.add_argument("--pair", type=float, nargs="*", default=[3.0, 10.0])
    p.add_argument("--only", nargs="*", help="run just these scenario names")
    p.add_argument(
        "--duration", type=float, default=None, help="training seconds per run (150; quick: 60)"
    )
    p.add_argument(
        "--extend", nargs="*", default=[], metavar="NAME=SECONDS", help="train these longer"
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=None,
        help="the daemons' step time (s); default: measured on gasloc-none (or the last "
        "calibration recorded)",
    )
    p.add_argument("--common-at", type=float, default=2 / 3)
    p.add_argument("--model", default="tiny")
    p.add_argument("--codec", default="fp16")
    p.add_argument("--inner-steps", type=int, default=30)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--metrics-port", type=int, default=9464)
    p.add_argument(
        "--control-mbit",
        type=float,
        default=0.1,
        help="added to each straggler's link for the DHT's own traffic (Mbit/s)",
    )
    p.add_argument("--note", action="append", default=[], help="a note for the report")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    try:
        args.durations = {k: float(v) for k, v in (x.split("=", 1) for x in args.extend)}
    except ValueError:
        p.error("--extend takes NAME=SECONDS")
    signal.signal(signal.SIGTERM, network._interrupted)
    if args.quick:
        args.only = args.only or ["gasloc-none", "gasloc-10x"]
    args.duration = args.duration or (60.0 if args.quick else 150.0)
    out = args.out or (RESULTS if not args.quick else Path("/tmp/gaslocd-stragglers-quick"))
    data = out / STEM
    data.mkdir(parents=True, exist_ok=True)
    meta_path = data / "meta.json"
    every = scenarios(args.multiples, args.pair)
    todo = [s for s in every if not args.only or s.name in args.only]
    if not args.report_only:
        ok, why = netns.available()
        if not ok:
            print(f"network namespaces unavailable: {why}", file=sys.stderr)
            return 2
        # No netns.cleanup_stale() here: it removes every lab's namespaces, also those of
        # a test or bench running beside this one; each run takes a free lab number.
        old = json.loads(meta_path.read_text()) if args.only and meta_path.exists() else {}
        meta = _meta(args, old)
        code_dir = Path("/tmp/gaslocd-stragglers/code")
        meta["code"] = snapshot_code(code_dir)
        print(f"daemon code: {meta['code']}", flush=True)
        meta_path.write_text(json.dumps(meta, indent=1))
        for sc in todo:
            if sc.multiples and "calibration" not in meta:
                raise SystemExit("no round time yet: run gasloc-none first or give --step-time")
            rates = (
                host_rates(
                    sc,
                    args.workers,
                    args.rate_mbit,
                    meta["numel"],
                    args.codec,
                    meta["calibration"]["round_s"],
                    args.control_mbit,
                )
                if sc.multiples
                else [args.rate_mbit] * args.workers
            )
            began = time.monotonic()
            print(f"== {sc.name}: {sc.label}; rates {[round(x, 3) for x in rates]}", flush=True)
            work = Path("/tmp/gaslocd-network") / STEM / sc.name
            try:
                result = run_one(sc, args, rates, code_dir, work)
            except Exception as exc:  # kept in the report: a daemon's failure is a finding
                logs = {
                    f"host{i}": (work / f"host{i}.log").read_text(errors="replace")
                    for i in range(args.workers)
                    if (work / f"host{i}.log").exists()
                }
                why = exit_lines(logs) or str(exc)[:300]
                print(f"   FAILED: {why}; logs in {work}", flush=True)
                meta.setdefault("failed", []).append({"scenario": sc.name, "error": why})
                meta_path.write_text(json.dumps(meta, indent=1))
                continue
            (data / f"{sc.name}.json").write_text(json.dumps(result))
            trouble = sum(len(h["tracebacks"]) for h in result["hosts"])
            print(
                f"   done in {time.monotonic() - began:.0f} s; final loss "
                f"{final_loss(result['curve']):.4f}; tracebacks {trouble}; "
                f"killed {result['killed']}",
                flush=True,
            )
            if sc.name == "gasloc-none" and "calibration" not in meta:
                meta["calibration"] = _calibration(step_time(result["hosts"]), args, "measured")
                cal = meta["calibration"]
                print(f"   calibrated: step {cal['step_s']:.4f} s, T {cal['round_s']:.2f} s")
            if sc.name == "gasloc-none" and args.metrics_port is not None:
                # A fast host's: its per-round reads and the headers of its θ̃ traffic
                # too, so more than a straggler's own (reported, not added).
                control = control_mbit(result["hosts"], result["duration_s"])
                meta["fast_control_mbit"] = control
                print(f"   non-θ̃ traffic of a fast host: {control:.3f} Mbit/s")
            if sc.name == "gasloc-none":
                meta["straggler_rates"] = _rates_list(args, meta)
                meta_path.write_text(json.dumps(meta, indent=1))
        meta["straggler_rates"] = _rates_list(args, meta)
        meta_path.write_text(json.dumps(meta, indent=1))
    meta = json.loads(meta_path.read_text())
    runs = [
        json.loads((data / f"{s.name}.json").read_text())
        for s in every
        if (data / f"{s.name}.json").exists()
    ]
    if not runs:
        print("no runs to report", file=sys.stderr)
        return 1
    text = write_report(runs, meta, out)
    (out / f"{STEM}.md").write_text(text)
    print(text)
    return 0


def _calibration(step_s: float, args: argparse.Namespace, how: str) -> dict[str, Any]:
    source = {
        "measured": "from the GASLoC run without straggler (the median over hosts of "
        "training seconds per inner step in its window)",
        "given": "as given with --step-time",
    }[how]
    return {"step_s": step_s, "round_s": args.inner_steps * step_s, "source": source}


def _rates_list(args: argparse.Namespace, meta: dict[str, Any]) -> list[tuple[float, float]]:
    if "calibration" not in meta:
        return []
    multiples = sorted(set(args.multiples) | set(args.pair))
    round_s = meta["calibration"]["round_s"]
    control = meta.get("control_mbit", 0.0)
    return [
        (m, link_rate_mbit(meta["numel"], args.codec, m * round_s) + control) for m in multiples
    ]


def _meta(args: argparse.Namespace, old: dict[str, Any]) -> dict[str, Any]:
    from gaslocd.train.model import build_model

    net = build_model(args.model, vocab_size=256, seq_len=args.seq_len, seed=0)
    numel = sum(p.numel() for p in net.parameters())
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    meta: dict[str, Any] = {
        "commands": [*old.get("commands", []), command],
        "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}",
        "date": datetime.date.today().isoformat(),
        **{k: getattr(args, k) for k in ("workers", "rate_mbit", "duration", "model", "codec")},
        **{k: getattr(args, k) for k in ("inner_steps", "seq_len", "batch_size", "eval_every")},
        "eval_batches": args.eval_batches,
        "common_at": args.common_at,
        "numel": numel,
        "control_mbit": args.control_mbit,
        "fp16_bytes": message_bytes("fp16", numel),
        "fast_fp16_s": link_rate_seconds(numel, args.codec, args.rate_mbit),
        "notes": [*old.get("notes", []), *args.note],
    }
    if args.step_time is not None:
        meta["calibration"] = _calibration(args.step_time, args, "given")
    elif "calibration" in old:
        meta["calibration"] = old["calibration"]
    rerun = set(args.only or ())
    if old.get("failed"):  # a rerun replaces a failed run's record
        meta["failed"] = [f for f in old["failed"] if f["scenario"] not in rerun]
    return meta


def link_rate_seconds(numel: int, codec: str, rate_mbit: float) -> float:
    """Seconds one ``codec`` message of ``numel`` values takes at ``rate_mbit``."""
    return message_bytes(codec, numel) * 8 / (rate_mbit * 1e6)


if __name__ == "__main__":
    sys.exit(main())

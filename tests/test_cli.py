"""The CLI contract: flag > GASLOCD_* environment > --config TOML > default; clear errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gaslocd.cli import build_parser, main, parse
from gaslocd.cli.configs import (
    TARGETS,
    algo_config,
    daemon_config,
    sim_config,
    train_config,
    wire_config,
)
from gaslocd.cli.demo import _DEMO_ONLY, daemon_argv, daemon_settings
from gaslocd.cli.settings import COMMANDS, DEMO, SETTINGS, START, settings_of
from gaslocd.daemon.demo import DemoDaemon, _child_env

BOOL_WORDS = [
    ("1", True),
    ("true", True),
    ("TRUE", True),
    ("Yes", True),
    ("on", True),
    ("0", False),
    ("false", False),
    ("False", False),
    ("NO", False),
    ("off", False),
]


def _values(argv: list[str]) -> dict[str, Any]:
    return parse(argv)[1]


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gaslocd: error: ")
    return lines[0]


def test_precedence_flag_over_env_over_config_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('inner-steps = 12\nrun_id = "from-file"\ncodec = "bf16"\n')
    base = ["--config", str(cfg), "start"]
    got = _values(base)
    assert (got["inner_steps"], got["run_id"], got["codec"], got["port"]) == (
        12,
        "from-file",
        "bf16",
        7070,
    )
    monkeypatch.setenv("GASLOCD_INNER_STEPS", "7")
    monkeypatch.setenv("GASLOCD_TOKEN", "env-secret")
    got = _values(base)
    assert (got["inner_steps"], got["token"]) == (7, "env-secret")
    assert _values([*base, "--inner-steps", "3"])["inner_steps"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "/nonexistent.toml", "start"], "does not exist"),
        (["start", "--host", "0.0.0.0", "--port", "0"], "without --token"),
        (["join", "--port", "0"], "--bootstrap"),
        (["start", "--resume", "--port", "0"], "--checkpoint-dir"),
        (["simulate", "--workers", "4", "--unreachable", "5"], "unreachable must be in"),
    ],
)
def test_bad_settings_exit_2_with_a_readable_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_broken_toml_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("inner-steps = = 3\n")
    assert main(["--config", str(bad), "start"]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_bootstrap_from_the_environment_is_a_list_of_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "GASLOCD_BOOTSTRAP", "/ip4/10.0.0.1/tcp/1/p2p/Qm1, /ip4/10.0.0.2/tcp/1/p2p/Qm2"
    )
    got = _values(["join"])
    assert got["bootstrap"] == ("/ip4/10.0.0.1/tcp/1/p2p/Qm1", "/ip4/10.0.0.2/tcp/1/p2p/Qm2")
    assert daemon_config(got).bootstrap == got["bootstrap"]


# -- booleans ----------------------------------------------------------------------------


@pytest.mark.parametrize(("word", "expected"), BOOL_WORDS)
def test_booleans_from_the_environment_read_as_written(
    word: str, expected: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GASLOCD_RESUME", word)
    monkeypatch.setenv("GASLOCD_NO_ADAPT_H", word)
    monkeypatch.setenv("GASLOCD_CHECKPOINT_DIR", str(tmp_path))
    got = _values(["start"])
    assert daemon_config(got).resume is expected
    assert algo_config(got).adapt_h is (not expected)


def test_resume_false_in_the_environment_does_not_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    # bool("false") is True: the bug this parsing replaces.
    monkeypatch.setenv("GASLOCD_RESUME", "false")
    assert daemon_config(_values(["start"])).resume is False


def test_no_adapt_h_yes_in_the_environment_disables_adaptation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GASLOCD_NO_ADAPT_H", "yes")
    assert algo_config(_values(["join"])).adapt_h is False
    monkeypatch.setenv("GASLOCD_ADAPT_H", "off")
    assert algo_config(_values(["simulate"])).adapt_h is False


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("resume = false", False),
        ("resume = true", True),
        ('resume = "on"', True),
        ("resume = 0", False),
    ],
)
def test_booleans_from_toml(line: str, expected: bool, tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'{line}\ncheckpoint-dir = "{tmp_path}"\nno-adapt-h = "YES"\n')
    got = _values(["start", "--config", str(cfg)])
    assert daemon_config(got).resume is expected
    assert algo_config(got).adapt_h is False


def test_switch_flags_stay_flags() -> None:
    assert _values(["start", "--resume", "--no-adapt-h"])["resume"] is True
    assert algo_config(_values(["simulate", "--adapt-h"])).adapt_h is True
    assert algo_config(_values(["start"])).adapt_h is True  # daemons adapt unless told not to
    assert algo_config(_values(["simulate"])).adapt_h is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--resume", "false"])


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GASLOCD_RESUME": "maybe"}, "GASLOCD_RESUME"),
        ({"GASLOCD_NO_ADAPT_H": "2"}, "GASLOCD_NO_ADAPT_H"),
        ({"GASLOCD_SEQ_LEN": "long"}, "GASLOCD_SEQ_LEN"),
        ({"GASLOCD_CODEC": "fp8"}, "GASLOCD_CODEC"),
        ({"GASLOCD_LOG_LEVEL": "loud"}, "GASLOCD_LOG_LEVEL"),
    ],
)
def test_a_bad_environment_value_exits_2_with_one_line(
    env: dict[str, str],
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["start"]) == 2
    line = _one_error_line(capsys)
    assert named in line and repr(next(iter(env.values()))) in line


def test_a_bad_toml_boolean_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('resume = "perhaps"\n')
    assert main(["start", "--config", str(cfg)]) == 2
    line = _one_error_line(capsys)
    assert "resume" in line and "'perhaps'" in line and "true/false" in line


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GASLOCD_ANNOUNCE", "")
    monkeypatch.setenv("GASLOCD_PORT", "")
    got = _values(["start"])
    assert (got["announce"], got["port"]) == (None, 7070)


def test_other_commands_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # The container image sets daemon variables and runs `status` as its health check.
    monkeypatch.setenv("GASLOCD_PORT", "not-a-port-for-status")
    assert _values(["status"])["status_address"] == "127.0.0.1:7070"


# -- the config file ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "hint"), [("seq_lne", "'seq_len'"), ("inner-stepz", "'inner-steps'"), ("zzz", None)]
)
def test_unknown_toml_key_is_refused(
    key: str, hint: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"{key} = 3\n")
    assert main(["--config", str(cfg), "start"]) == 2
    line = _one_error_line(capsys)
    assert repr(key) in line and "unknown setting" in line
    assert (hint in line) if hint else ("did you mean" not in line)


def test_a_shared_config_file_serves_every_command(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'run-id = "shared"\ntoken = "s"\ncheckpoint_dir = "ckpt"\nbandwidth = 50\nworkdir = "w"\n'
    )
    status = _values(["status", "--config", str(cfg)])
    assert (status["run_id"], status["token"]) == ("shared", "s")
    assert "checkpoint_dir" not in status
    assert _values(["start", "--config", str(cfg)])["checkpoint_dir"] == "ckpt"
    assert sim_config(_values(["simulate", "--config", str(cfg)])).bandwidth_mbps == 50.0


def test_toml_arrays_and_the_same_key_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('straggler = ["0:0.5", "1:0.25"]\nworkers = 4\n')
    sim = sim_config(_values(["simulate", "--config", str(cfg)]))
    assert [(s.worker, s.fraction) for s in sim.stragglers] == [(0, 0.5), (1, 0.25)]
    cfg.write_text("seq_len = 4\nseq-len = 5\n")
    assert main(["start", "--config", str(cfg)]) == 2
    assert "twice" in _one_error_line(capsys)


# -- where global flags go ---------------------------------------------------------------


def test_config_and_log_level_after_the_command(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("seq_len = 64\n")
    got = _values(["start", "--log-level", "debug", "--config", str(cfg)])
    assert (got["log_level"], got["seq_len"]) == ("DEBUG", 64)
    before = _values(["--log-level", "error", "--config", str(cfg), "status"])
    assert before["log_level"] == "ERROR" and before["config"] == cfg
    later_wins = _values(["--log-level", "error", "simulate", "--log-level", "warning"])
    assert later_wins["log_level"] == "WARNING"


# -- --help ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_defaults_and_variables(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for setting in settings_of(command):
        assert f"env {setting.env})" in text, setting.name
    if command == START:
        assert "(default: 128; env GASLOCD_SEQ_LEN)" in text
        assert "(default: 7070; env GASLOCD_PORT)" in text
        assert "(default: off; env GASLOCD_RESUME)" in text
    if command == "simulate":
        assert "(default: fp32; env GASLOCD_CODEC)" in text  # the per-command default


# -- the table ---------------------------------------------------------------------------


def test_each_setting_is_declared_once() -> None:
    names = Counter(s.name for s in SETTINGS)
    assert [n for n, k in names.items() if k > 1] == []
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)
    for command in COMMANDS:
        options = Counter(s.option for s in settings_of(command))
        assert [o for o, k in options.items() if k > 1] == [], command
        filled = Counter(spec for s in settings_of(command) for spec in s.fields)
        assert [f for f, k in filled.items() if k > 1] == [], command
    for setting in SETTINGS:
        assert setting.commands and setting.commands <= set(COMMANDS), setting.name
        for spec in setting.fields:
            owner, _, name = spec.partition(".")
            assert name in {f.name for f in dataclasses.fields(TARGETS[owner])}, spec


def test_simulate_passes_the_run_id_through() -> None:
    assert sim_config(_values(["simulate"])).run_id is None
    assert sim_config(_values(["simulate", "--run-id", "exp-1"])).run_id == "exp-1"


# -- the demo's daemons ------------------------------------------------------------------


def _slot(index: int, tmp_path: Path) -> DemoDaemon:
    return DemoDaemon(
        index=index,
        role="start" if index == 0 else "join",
        run_id="demo-abc",
        workers=3,
        rounds=5,
        checkpoint_dir=tmp_path / f"w{index}",
        summary_json=tmp_path / f"w{index}.json",
        address_file=tmp_path / "bootstrap.txt" if index == 0 else None,
        bootstrap=None if index == 0 else "/ip4/127.0.0.1/tcp/1/p2p/Qm",
    )


DEMO_ARGV = [
    "demo",
    "--inner-steps",
    "6",
    "--seq-len",
    "32",
    "--inner-lr",
    "3e-3",
    "--seed",
    "-1",
    "--codec",
    "int8",
    "--no-adapt-h",
    "--metrics",
    "--daemon-log-level",
    "info",
    "--outer-lr",
    "0.5",
    "--data",
    "corpus dir",
]


@pytest.mark.parametrize("index", [0, 1])
def test_demo_daemon_argv_round_trips(index: int, tmp_path: Path) -> None:
    demo = parse(DEMO_ARGV, env={})[1]
    slot = _slot(index, tmp_path)
    argv = daemon_argv(demo, slot)
    command, back = parse(argv, env={})
    expected = daemon_settings(demo, slot)
    assert command == slot.role
    assert back == {**expected, "config": None}
    for build in (algo_config, train_config, daemon_config, wire_config):
        assert build(back) == build(expected)
    daemon = daemon_config(back)
    assert (daemon.port, daemon.min_peers, daemon.max_rounds, daemon.metrics_port) == (0, 3, 5, 0)
    assert algo_config(back).adapt_h is False and train_config(back).seed == -1


def test_every_setting_the_demo_shares_reaches_its_daemons(tmp_path: Path) -> None:
    demo = parse(DEMO_ARGV, env={})[1]
    shared = {s.name for s in settings_of(DEMO)} & {s.name for s in settings_of(START)}
    got = daemon_settings(demo, _slot(0, tmp_path))
    for name in shared - _DEMO_ONLY:
        assert got[name] == demo[name], name


def test_demo_daemons_get_no_gaslocd_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GASLOCD_HOST", "0.0.0.0")
    monkeypatch.setenv("GASLOCD_CONFIG", "/elsewhere.toml")
    env = _child_env()
    assert not [k for k in env if k.startswith("GASLOCD_")]
    assert env["PYTHONUNBUFFERED"] == "1"


def test_python_dash_m_gaslocd_runs_the_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gaslocd", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("gaslocd ")


def test_status_is_cheap_enough_for_a_health_check() -> None:
    # The image's health check runs `gaslocd status` every 30 s: it must not import torch
    # or hivemind (seconds and ~250 MB each time). Measured: 0.6 s and 40 MB max RSS.
    argv = ["-X", "importtime", "-m", "gaslocd", "status", "127.0.0.1:1", "--timeout", "0.2"]
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "did not answer" in proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "grpc" in imported  # the measurement works
    assert not {name for name in imported if name.split(".")[0] in ("torch", "hivemind")}

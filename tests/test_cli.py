"""The CLI contract: flag > GASLOCD_* environment > --config TOML > default; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gaslocd.cli import _load_config_file, build_parser, main


def _parse(argv: list[str]) -> object:
    return build_parser(_load_config_file(argv)).parse_args(argv)


def test_precedence_flag_over_env_over_config_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('inner-steps = 12\nrun_id = "from-file"\ncodec = "bf16"\n')
    base = ["--config", str(cfg), "start"]
    ns = _parse(base)
    assert (ns.inner_steps, ns.run_id, ns.codec, ns.port) == (12, "from-file", "bf16", 7070)
    monkeypatch.setenv("GASLOCD_INNER_STEPS", "7")
    monkeypatch.setenv("GASLOCD_TOKEN", "env-secret")
    ns = _parse(base)
    assert (ns.inner_steps, ns.token) == (7, "env-secret")
    ns = _parse([*base, "--inner-steps", "3"])
    assert ns.inner_steps == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "/nonexistent.toml", "start"], "does not exist"),
        (["start", "--host", "0.0.0.0", "--port", "0"], "without --token"),
        (["join", "--port", "0"], "--bootstrap"),
        (["start", "--resume", "--port", "0"], "--checkpoint-dir"),
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
    ns = _parse(["join"])
    assert ns.bootstrap == ["/ip4/10.0.0.1/tcp/1/p2p/Qm1", "/ip4/10.0.0.2/tcp/1/p2p/Qm2"]

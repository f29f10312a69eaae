"""Where settings come from: flags, ``GASLOCD_*`` variables, a ``--config`` TOML file.

Precedence is flag > environment > file > built-in default, decided here and only here
(nothing below the CLI reads the environment). The parser's flags default to "absent"
(``argparse.SUPPRESS``), so a flag that was not typed can be told from one typed with
its default value, and the lower sources are consulted for the rest.

Rules, chosen so that one file and one environment can serve every command:

- A TOML key must name some setting (``seq_len`` or ``seq-len``); an unknown key is
  refused with the closest known name, because a typo would otherwise run with the
  default unnoticed. A key of another command is accepted and ignored: a file shared by
  ``start``, ``join`` and ``status`` holds ``token`` and ``checkpoint_dir`` alike. Every
  key's value is still checked, whichever command reads the file.
- A ``GASLOCD_*`` variable is read only for the command's own settings and otherwise
  ignored: the container image sets ``GASLOCD_PORT`` for the daemon and runs ``status``
  in the same environment, and deploy scripts use other ``GASLOCD_*`` names of their own.
  An empty variable counts as unset, as compose's ``${VAR:-}`` writes one.
- Booleans read 1/0, true/false, yes/no, on/off in any case; on the command line they
  stay ``store_true`` flags.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaslocd.cli import values as v
from gaslocd.cli.settings import BY_NAME, SETTINGS, Setting, settings_of

FILE_NOTE = (
    "Every setting is also read from GASLOCD_<NAME> (shown with each flag) and from the "
    "--config TOML file as name = value (seq_len or seq-len); a flag beats the environment, "
    "which beats the file, which beats the default. Booleans: 1/0, true/false, yes/no, on/off."
)


@dataclass(frozen=True)
class Command:
    """A subcommand: its help, and what runs it with the resolved settings."""

    name: str
    help: str
    description: str
    run: Callable[[str, dict[str, Any]], int]


# -- the command line ------------------------------------------------------------------


def _shown(setting: Setting, command: str | None) -> str | None:
    if setting.shown_default is not None:
        return setting.shown_default
    default = setting.default if command is None else setting.default_for(command)
    if setting.kind == "switch":
        return "off" if not default else "on"
    if default is None or default in ("", ()):
        return None
    return v.to_text(default)


def help_text(setting: Setting, command: str | None) -> str:
    """The flag's help with its default and variable, e.g. "(default: 128; env GASLOCD_SEQ_LEN)".

    The default shown is the built-in one: --help describes the command, not whatever
    this shell's environment or a config file would change it to.
    """
    shown = _shown(setting, command)
    tail = f"default: {shown}; env {setting.env}" if shown is not None else f"env {setting.env}"
    return f"{setting.help} ({tail})".replace("%", "%%")


def _for_argparse(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    # argparse prints an ArgumentTypeError's message but replaces a ValueError's with
    # "invalid <function name> value", which would hide the parser's reason.
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def add_flag(
    container: argparse.ArgumentParser | argparse._ArgumentGroup,
    setting: Setting,
    command: str | None,
) -> None:
    """Declare ``setting`` on a parser; absent unless typed (see the module docstring)."""
    kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text(setting, command)}
    if setting.kind == "switch":
        container.add_argument(setting.option, dest=setting.name, action="store_true", **kwargs)
        return
    kwargs.update(type=_for_argparse(setting.parse), metavar=setting.metavar)
    if setting.choices is not None:
        kwargs["choices"] = setting.choices
    if setting.kind == "list":
        kwargs["action"] = "append"
    if setting.positional:
        container.add_argument(setting.name, nargs="?", **kwargs)
    else:
        container.add_argument(setting.option, dest=setting.name, **kwargs)


def add_command(sub: argparse._SubParsersAction, command: Command) -> None:
    """A subparser with the command's settings, grouped as the table groups them."""
    parser = sub.add_parser(
        command.name, help=command.help, description=command.description, epilog=FILE_NOTE
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for setting in settings_of(command.name):
        if setting.group not in groups:
            groups[setting.group] = parser.add_argument_group(setting.group)
        add_flag(groups[setting.group], setting, command.name)


# -- the config file -------------------------------------------------------------------


def _unknown_key(path: Path, key: str) -> str:
    name = key.replace("-", "_")
    if name in BY_NAME:
        return f"config file {path}: {key!r} cannot be set in a config file"
    message = f"config file {path}: unknown setting {key!r}"
    known = [s.name for s in SETTINGS if s.in_file]
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        suggestion = close[0].replace("_", "-") if "-" in key else close[0]
        message += f" (did you mean {suggestion!r}?)"
    return message


def parse_text(setting: Setting, text: str) -> Any:
    """One source's text through the setting's parser (and its choices)."""
    if setting.kind == "list":
        return tuple(setting.parse(item) for item in v.split_list(text))
    value = setting.parse(text)
    if setting.choices is not None and value not in setting.choices:
        raise ValueError(f"must be one of {', '.join(setting.choices)}, got {text!r}")
    return value


def _file_value(setting: Setting, raw: object) -> Any:
    if setting.kind == "list" and isinstance(raw, list):
        return tuple(setting.parse(v.from_toml(item)) for item in raw)
    if isinstance(raw, list):
        raise ValueError("expected a single value, got an array")
    return parse_text(setting, v.from_toml(raw))


def load_config(path: Path) -> dict[str, Any]:
    """The file's settings by name, each parsed and checked; refuses unknown keys."""
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"config file {path} is a directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    found: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        setting = BY_NAME.get(name)
        if setting is None or not setting.in_file:
            raise ValueError(_unknown_key(path, key))
        if name in found:
            raise ValueError(f"config file {path}: {name!r} is given twice (- and _ spellings)")
        try:
            found[name] = _file_value(setting, value)
        except ValueError as exc:
            raise ValueError(f"config file {path}: {key}: {exc}") from None
    return found


# -- resolution ------------------------------------------------------------------------


def _from_env(setting: Setting, env: Mapping[str, str]) -> tuple[bool, Any]:
    text = env.get(setting.env, "")
    if not text:
        return False, None
    try:
        return True, parse_text(setting, text)
    except ValueError as exc:
        raise ValueError(f"{setting.env}: {exc}") from None


def resolve(command: str, given: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Every setting of ``command``: flag > environment > config file > default.

    ``given`` holds only the flags that were typed (the parser's namespace); raises
    ``ValueError`` with one line naming the source of a wrong value.
    """
    config = given.get("config")
    if config is None:
        config = _from_env(BY_NAME["config"], env)[1]
    in_file = load_config(config) if config is not None else {}
    resolved: dict[str, Any] = {}
    for setting in settings_of(command):
        if setting.name in given:
            value = given[setting.name]
            resolved[setting.name] = tuple(value) if setting.kind == "list" else value
            continue
        found, value = _from_env(setting, env)
        if found:
            resolved[setting.name] = value
        elif setting.name in in_file:
            resolved[setting.name] = in_file[setting.name]
        else:
            resolved[setting.name] = setting.default_for(command)
    resolved["config"] = config
    return resolved


def to_argv(command: str, resolved: Mapping[str, Any]) -> list[str]:
    """Arguments that make ``command`` resolve to ``resolved`` again, from the table.

    Only values that differ from the command's default are written, so the result is
    exact only where no ``GASLOCD_*`` variable or config file adds to it: the demo
    starts its daemons without either. Options use ``--flag=value`` so that values
    starting with "-" stay values.
    """
    argv = [command]
    for setting in settings_of(command):
        if setting.name not in resolved:
            continue
        value = resolved[setting.name]
        if value == setting.default_for(command):
            continue
        if value is None or (setting.kind == "switch" and not value):
            raise ValueError(f"{setting.option} cannot be set back to {value!r} by a flag")
        if setting.kind == "switch":
            argv.append(setting.option)
        elif setting.kind == "list":
            argv += [f"{setting.option}={v.to_text(item)}" for item in value]
        elif setting.positional:
            argv.append(v.to_text(value))
        else:
            argv.append(f"{setting.option}={v.to_text(value)}")
    return argv


def given_flags(namespace: argparse.Namespace) -> dict[str, Any]:
    """The typed flags of a parsed namespace, by setting name."""
    return {k: value for k, value in vars(namespace).items() if k in BY_NAME}


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str], env: Mapping[str, str]
) -> tuple[str, dict[str, Any]]:
    """Parse ``argv`` and resolve every setting of its command (argparse exits 2 itself)."""
    namespace = parser.parse_args(list(argv))
    command = str(namespace.command)
    return command, resolve(command, given_flags(namespace), env)

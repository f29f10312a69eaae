"""How a setting's text becomes a value, and a value text again.

Every source of a setting (a flag, a ``GASLOCD_*`` variable, a key of the ``--config``
file) arrives as text or is turned into text first, so that one parser per setting
decides what is valid and the error reads the same whichever source was wrong. Parsers
raise ``ValueError`` with the reason only; the caller prefixes where the value came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gaslocd.config import Straggler

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_bool(text: str) -> bool:
    """Booleans as people write them in shells and config files.

    ``bool("false")`` is true, which made ``GASLOCD_RESUME=false`` resume; anything
    outside the usual spellings is refused rather than guessed.
    """
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {text!r}")


def integer(text: str) -> int:
    """An integer, with a message that names the value instead of Python's literal jargon."""
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer ≥ 1: counts where zero would silently mean "nothing happens"."""
    value = integer(text)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def number(text: str) -> float:
    """A float; range checks stay with the config objects, which know each one's bounds."""
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def text_value(text: str) -> str:
    """Free text (names, addresses, paths), taken as given."""
    return text


def path(text: str) -> Path:
    """A file path; checked for existence where it is opened, not here."""
    return Path(text)


def log_level(text: str) -> str:
    """A logging level name in any case, refused early rather than by ``basicConfig``."""
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def straggler(text: str) -> Straggler:
    """``I:FRACTION`` (``0:0.1``): worker I gets that fraction of the bandwidth."""
    return Straggler.parse(text)


def split_list(text: str) -> list[str]:
    """Items of a list setting given as one string: separated by commas or spaces.

    An environment variable can hold only one string, and a repeatable flag's items never
    contain either separator (multiaddrs, ``I:FRACTION``).
    """
    return [item for item in text.replace(",", " ").split() if item]


def from_toml(value: object) -> str:
    """A TOML scalar as the text a flag would carry, so the setting's parser judges it.

    Tables and arrays are refused here: no setting is a table, and lists are unpacked by
    the caller before their items come here.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    kind = "a table" if isinstance(value, dict) else type(value).__name__
    raise ValueError(f"expected a single value, got {kind}")


def to_text(value: Any) -> str:
    """A parsed value back to text its parser reads as the same value (for generated argv).

    Floats use ``repr``, the shortest text that round-trips exactly.
    """
    if isinstance(value, Straggler):
        return f"{value.worker}:{value.fraction!r}"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def json_args(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Resolved settings as JSON values, recorded in a run's summary to repeat it."""
    out: dict[str, Any] = {}
    for name, value in resolved.items():
        if isinstance(value, tuple):
            out[name] = [to_text(x) for x in value]
        elif value is None or isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = to_text(value)
    return out

"""Compatibility name for :mod:`gaslocd.daemon.lifecycle` (the daemon was split)."""

from gaslocd.daemon.lifecycle import EXIT_OK, EXIT_STARTUP, Daemon, StartupError

__all__ = ["EXIT_OK", "EXIT_STARTUP", "Daemon", "StartupError"]

"""gaslocd: a peer-to-peer daemon for decentralized LLM pretraining with GASLoC.

The library API (:class:`gaslocd.Peer`) is imported on first use: ``gaslocd status`` and
``--help`` must not pay for torch and hivemind.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Peer", "PeerStopped", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Peer", "PeerStopped"):
        from gaslocd import peer

        return getattr(peer, name)
    raise AttributeError(f"module 'gaslocd' has no attribute {name!r}")

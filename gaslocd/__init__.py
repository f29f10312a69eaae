"""gaslocd: a peer-to-peer daemon for decentralized LLM pretraining with GASLoC."""

__version__ = "0.1.0"

"""Layer 5: N workers in one process running the daemon's round on a simulated clock.

``schedule`` drives the protocol's rules (:mod:`gaslocd.protocol`) for every simulated
peer with the clock's ``now`` (``clock``: the time arithmetic and where time goes);
``runner`` adds the models (:class:`gaslocd.train.worker.Worker`) and the in-memory wire;
``replay`` re-times a run on another network when that is exact; ``summary`` is the JSON.
"""

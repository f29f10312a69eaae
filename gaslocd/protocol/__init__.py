"""The round's decisions, shared by the simulator and the daemon (docs/design.md §2).

Pure: no I/O, no clock reads, no randomness of their own. Whatever depends on time takes
the clock's ``now`` as an argument, so the simulator drives these rules with its
simulated clock, the daemon with ``time.monotonic()``, and unit tests with a fake one.
"""

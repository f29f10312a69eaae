"""The paper's comparisons at CPU scale (issue 5): grid, runner, tables and plots.

``bench/paper.py`` is the command; this package holds its parts so that each stays
readable: :mod:`.grid` says what runs, :mod:`.execute` runs it (cached, in parallel),
:mod:`.analysis` turns summaries into numbers, :mod:`.report` (and :mod:`.shared`, the
re-run with the daemon's round) into markdown and :mod:`.plots` into PNGs.
"""

"""The paper's comparisons at CPU scale (issue 5): grid, runner, tables and plots.

``bench/paper.py`` is the command; this package holds its parts so that each stays
readable: :mod:`.grid` says what runs, :mod:`.execute` runs it (cached, in parallel),
:mod:`.policy` holds a proposed H rule tried here only, :mod:`.analysis` turns summaries
into numbers, :mod:`.report` into markdown and :mod:`.plots` into PNGs.
"""

"""``python -m gaslocd`` is the ``gaslocd`` command."""

from gaslocd.cli import main

raise SystemExit(main())

"""`python -m multispec ...`: the `multispec` command (also for `accelerate launch -m multispec`)."""

from .cli import main

raise SystemExit(main())

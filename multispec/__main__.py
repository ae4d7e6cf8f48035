"""`python -m multispec ...`: the `multispec` command (also for `accelerate launch -m multispec`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

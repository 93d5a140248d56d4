"""``python -m chexnet_utils ...``: see :mod:`chexnet_utils.cli`."""

from chexnet_utils.cli import main

raise SystemExit(main())

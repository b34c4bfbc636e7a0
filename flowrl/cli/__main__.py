"""`python -m flowrl.cli ...`, as `flowrl ...`."""

import sys

from flowrl.cli.commands import main

sys.exit(main())

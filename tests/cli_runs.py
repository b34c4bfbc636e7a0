"""Several `flowrl` command lines in one process, one after the other; under torchrun every rank runs them all,
in one process group (a launch of two ranks costs ~20 s of imports on 2 cores, once for all of them):

    python -m torch.distributed.run --nproc-per-node 2 cli_runs.py '[["train", "grpo", ...], ["train", ...]]'

Exits with the first command line's status that is not 0.
"""

import json
import sys

from quick_imports import collector_off

with collector_off():  # each rank's imports (tests/quick_imports.py): the CLI and the trainer its `train` runs
    import flowrl.runtime.trainer  # noqa: F401
    from flowrl.cli import main

if __name__ == "__main__":
    for argv in json.loads(sys.argv[1]):
        code = main(argv)
        if code:
            sys.exit(code)

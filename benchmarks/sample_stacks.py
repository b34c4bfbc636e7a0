"""Runs a module with its main thread's stack written to stderr every few seconds: where a slow start spends its
time (benchmarks/cold_start.py --stacks-every). A Python thread reads `sys._current_frames()`, so the dumps
are safe where faulthandler's timed dumps crashed the child (a segfault on the CPU, 2026-12-04).

    python benchmarks/sample_stacks.py EVERY_S MODULE [ARGS...]      # as `python -m MODULE ARGS...`
    python benchmarks/sample_stacks.py EVERY_S SCRIPT.py [ARGS...]   # as `python SCRIPT.py ARGS...`
"""

from __future__ import annotations

import runpy
import sys
import threading
import time
import traceback

INNER, OWN = 8, 4  # each dump: the innermost frames, and the innermost frames of flowrl's own code above them


def _sample(every_s: float, start: float) -> None:
    main = threading.main_thread().ident
    while True:
        time.sleep(every_s)
        frame = sys._current_frames().get(main)
        if frame is not None:
            frames = traceback.extract_stack(frame)
            own = [f for f in frames[:-INNER] if "/flowrl/" in f.filename][-OWN:]
            stack = "".join(traceback.format_list([*own, *frames[-INNER:]]))
            print(f"--- main thread at {time.perf_counter() - start:.1f} s\n{stack}", file=sys.stderr, flush=True)


def main() -> None:
    every_s, module, rest = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    threading.Thread(target=_sample, args=(every_s, time.perf_counter()), daemon=True).start()
    sys.argv = [module, *rest]
    if module.endswith(".py"):
        runpy.run_path(module, run_name="__main__")
    else:
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

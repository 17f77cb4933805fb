"""One cell of the performance suite: seconds per round of one (model, clients, engine).

What a cell does and measures: ``benchmarks.perf.cell``.

``python -m benchmarks.perf`` runs every cell in its own process through this module's
command line (``--cell SPEC_JSON --result PATH``), so that the peak memory is the cell's
own and a crash or an out-of-memory kill costs one cell, not the suite.
``python -m benchmarks.perf.round_throughput [suite options]`` runs the suite's throughput
section alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from benchmarks.perf.cell import run_cell
from benchmarks.perf.suite import main as suite_main
from fl_lightning.core.engines import is_out_of_memory

__all__ = ["main", "run_cell"]


def main(argv: list[str] | None = None) -> int:
    """``--cell SPEC --result PATH``: one cell (what the suite runs). Without ``--cell``:
    the suite's throughput section, the other arguments being the suite's."""
    parser = argparse.ArgumentParser(description="Time one cell of the performance suite (see benchmarks.perf).")
    parser.add_argument("--cell", help="the cell as JSON: model, clients, engine, ...")
    parser.add_argument("--result", help="where to write the cell's entry (JSON)")
    args, rest = parser.parse_known_args(argv)
    if args.cell is None:
        return suite_main(["--sections", "throughput", *rest])
    if rest or args.result is None:
        parser.error("--cell needs --result and no other arguments")
    try:
        entry = {"status": "ok", **run_cell(json.loads(args.cell))}
        code = 0
    except Exception as error:  # recorded, not raised: the suite goes on with the next cell
        traceback.print_exc()
        entry = {
            "status": "out_of_memory" if is_out_of_memory(error) else "error",
            "error": f"{type(error).__name__}: {error}",
        }
        code = 1
    Path(args.result).write_text(json.dumps(entry))
    return code


if __name__ == "__main__":
    sys.exit(main())

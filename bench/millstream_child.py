"""The measured child of :mod:`bench.millstream_runner`: runs one processor to the end.

A module of its own so that the child imports only millstream and the jobs (not the
benchmark's meters and data generator), and starts the fork server before anything else,
as ``millstream run`` does: the server's imports overlap the child's.

Run by the runner as ``python -m bench.millstream_child <workload> <input> <run dir>
<options JSON> [--no-output]``.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    """Build the processor, run it until the input drains, write ``child.json``."""
    from millstream.runner.forkserver import start_fork_server

    start_fork_server()
    import json
    from dataclasses import asdict
    from pathlib import Path

    from bench.millstream_jobs import build_processor

    kind, input_dir, run_dir, options = argv[:4]
    processor = build_processor(
        Path(input_dir),
        kind,
        Path(run_dir),
        json.loads(options),
        write_output="--no-output" not in argv,
    )
    summary = processor.run_local(progress=False)
    print(f"    {summary}", flush=True)
    (Path(run_dir) / "child.json").write_text(json.dumps(asdict(summary)))


if __name__ == "__main__":
    main(sys.argv[1:])

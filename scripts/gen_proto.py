"""Generate the gRPC Python code in python/millstream/rpc/ from proto/.

Usage: ``python scripts/gen_proto.py`` regenerates; ``--check`` exits 1 when the committed
files differ from what regeneration would produce.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "python" / "millstream" / "rpc"
GENERATED = ("millstream_pb2.py", "millstream_pb2.pyi", "millstream_pb2_grpc.py")


def generate(into: Path) -> None:
    """Run protoc on proto/millstream/millstream.proto, writing flat modules into ``into``."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO_ROOT / "millstream" / "millstream.proto"),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        for name in GENERATED:
            text = (Path(tmp) / "millstream" / name).read_text()
            text = text.replace(
                "from millstream import millstream_pb2", "from millstream.rpc import millstream_pb2"
            )
            (into / name).write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if regeneration differs")
    args = parser.parse_args()
    if not args.check:
        generate(OUT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [n for n in GENERATED if not filecmp.cmp(Path(tmp) / n, OUT / n, shallow=False)]
    if stale:
        print(f"generated gRPC code is stale: {', '.join(stale)}; run `make proto`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generate the Python protobuf/gRPC code in gen/ from protos/.

Run: python scripts/gen_protos.py [--out DIR]
The generated code is committed; tests/unit/common/test_protos.py regenerates it
into a temporary folder and fails when it differs from gen/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
# agrpo/__init__.py: the Python API, imported lazily so the generated stubs stay light.
TOP_INIT = '''"""agrpo: `from agrpo import AsyncGRPOTrainer, AsyncGRPOConfig` (services/api); the protobuf
contract of the services is `agrpo.v1`, generated from protos/ by scripts/gen_protos.py."""

__all__ = ["AsyncGRPOConfig", "AsyncGRPOTrainer"]


def __getattr__(name):
    if name in __all__:
        from services import api

        return getattr(api, name)
    raise AttributeError(f"module 'agrpo' has no attribute {name!r}")
'''


def generate(out: Path) -> list[Path]:
    """Run protoc on every .proto under protos/ and return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for pkg in {p.parent for p in out.rglob("*_pb2.py")}:
        (pkg / "__init__.py").touch()
    (out / "agrpo" / "__init__.py").write_text(TOP_INIT)
    return sorted(out.rglob("*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gen")
    files = generate(parser.parse_args().out)
    print(f"wrote {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()

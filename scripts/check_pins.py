"""Check that the installed packages match the pins in pyproject.toml.

Usage: python scripts/check_pins.py [EXTRA ...]  (the core dependencies are always checked)

An extra can pull a newer release of a pinned package through another package's
requirements (timm -> torchvision -> a newer, CUDA torch): pip then reports success
while the environment no longer is the one the project tests. A local version label
(torch's "+cpu") is not part of the pin. Exits 1 listing every mismatch.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def pins(extras: list[str]) -> dict[str, str]:
    import tomllib  # Python 3.11+

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    out = {}
    for r in reqs:
        if "==" in r:
            name, ver = r.split("==", 1)
            out[name.strip()] = ver.split(";")[0].strip()
    return out


def main(extras: list[str]) -> int:
    if sys.version_info < (3, 11):
        print("check_pins: Python 3.11+ reads pyproject.toml; not checked", file=sys.stderr)
        return 0
    bad = []
    for name, want in pins(extras).items():
        try:
            got = version(name)
        except PackageNotFoundError:
            bad.append(f"{name}: not installed (pinned {want})")
            continue
        if got.split("+")[0] != want:
            bad.append(f"{name}: {got} installed, {want} pinned")
    for line in bad:
        print(f"check_pins: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Entry point of one Slurm task of `gpucluster validate --via-slurm`: the suite on this node, locally.

    python3 BUNDLE/checks/gpc_node.py BUNDLE PEERS

BUNDLE (on the shared flash tier) holds checks/, expectations.json and site/ (pytest, pluggy,
iniconfig, packaging, testinfra: pure Python, copied from the validating machine's environment), so a
node needs nothing but python3. Results go to BUNDLE/results/<node>.xml. Not a test module: pytest
never collects it (no test_ prefix).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    bundle = Path(argv[1]).resolve()
    peers = argv[2] if len(argv) > 2 else ""
    sys.dont_write_bytecode = True  # never write __pycache__ onto the shared tier from every node
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.path.insert(0, str(bundle / "site"))
    me = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    results = bundle / "results"
    results.mkdir(exist_ok=True)
    import pytest

    checks = bundle / "checks"
    rc = pytest.main([
        str(checks), "-c", str(checks / "pytest.ini"), f"--rootdir={checks}",
        f"--gpc-expect={bundle / 'expectations.json'}", "--gpc-mode=local", f"--gpc-me={me}",
        f"--gpc-hosts={me}", f"--gpc-peers={peers}", f"--junitxml={results / (me + '.xml')}",
        "-o", f"junit_suite_name=slurm:{me}", "-q", "-rN", "--tb=short", "--no-header",
        "-p", "no:cacheprovider", *argv[3:],
    ])
    print(f"gpucluster validate on {me}: pytest exit {int(rc)}", flush=True)
    return 0 if int(rc) in (0, 1) else int(rc)  # failed checks are results, not a failed task


if __name__ == "__main__":
    sys.exit(main(sys.argv))

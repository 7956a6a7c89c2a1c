"""Pulumi program entry (Pulumi.yaml: main: stacks/). Everything lives in gpucluster.deploy."""

from pathlib import Path

from gpucluster.deploy.program import main

main(Path(__file__).resolve().parent.parent)

"""Configless Slurm in the rendered slurm.conf: SlurmctldParameters carries enable_configless, merged with the
spec's own SlurmctldParameters (kept, never replaced, written once). docs/roles.md "Configless Slurm"."""

from __future__ import annotations

import pytest
from conftest import compiled, example_data, spec_from_data

from gpucluster.render import render_all


def _ctld_lines(parameters: dict) -> list[str]:
    data = example_data("staging")
    data["slurm"]["parameters"] = parameters
    text = render_all(compiled(spec_from_data(data)), cabling=False)["slurm.conf"]
    text = text if isinstance(text, str) else "".join(text())
    return [ln for ln in text.splitlines() if ln.lower().startswith("slurmctldparameters=")]


@pytest.mark.parametrize(("given", "want"), [
    ({}, "enable_configless"),
    ({"SlurmctldParameters": "idle_on_node_suspend"}, "enable_configless,idle_on_node_suspend"),
    ({"slurmctldparameters": "idle_on_node_suspend,enable_configless"}, "enable_configless,idle_on_node_suspend"),
])
def test_slurmctld_parameters_enable_configless_and_keep_the_specs(given, want):
    assert _ctld_lines(given) == [f"SlurmctldParameters={want}"]

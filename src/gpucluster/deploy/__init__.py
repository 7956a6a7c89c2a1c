"""Pulumi: the cluster as a component tree, node enrollment over SSH, secrets, stack outputs.

Importing this package imports nothing from the Pulumi SDK: `stackoutputs` (reading a stack's outputs
through the Pulumi CLI) works without it; `program`, `components` and `provider` need it.
"""

#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""The documentation of the gpucluster_apt action (plugins/action/gpucluster_apt.py), which does the work on the
controller: the probe (gpucluster_dpkg_status), then ansible.builtin.apt only where something is to be installed.
Run directly, without the action, it fails and says so."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_apt
short_description: ansible.builtin.apt, asking dpkg first whether every package is already at its version
description: Takes ansible.builtin.apt's arguments. With state present, a node where dpkg has every package at its
  wanted version is ok without apt running; anything else is apt with the same arguments.
options: {}
"""

from ansible.module_utils.basic import AnsibleModule

if __name__ == "__main__":
    AnsibleModule(argument_spec={}, bypass_checks=True).fail_json(
        msg="gpucluster_apt runs as an action plugin (ansible.cfg: action_plugins = plugins/action)")

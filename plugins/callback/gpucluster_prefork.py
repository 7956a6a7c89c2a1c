"""Load Ansible's Jinja filter and test plugins once, in the controller process, before any task runs.

Ansible runs every task of every host in a worker process forked from the controller process. The Jinja
filters and tests (`| default`, `| gpucluster_failed_checks`, `is abs`, ...) are found and wrapped the first time
a template uses one, and that cache lives in the process that used it. Nothing in the controller process
templates a filter before the first task, so every worker rebuilt the whole cache for itself and threw it away
when it exited: 7.4 ms of this machine's CPU per task that uses a filter (docs/roles.md, "Where a host-task's
cost goes"). Filled here, in `v2_playbook_on_start`, every worker inherits it from the fork.

It changes no result and prints nothing. Enabled by ansible.cfg (`callbacks_enabled`), by `gpucluster
configure` (configure/playbook.py) and on a node by `gpucluster-pull` (node/pullrunner.py).
"""

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
    name: gpucluster_prefork
    type: aggregate
    short_description: Load the Jinja filter and test plugins once, before the workers fork
    description:
      - Fills the filter and test plugin caches in the controller process at the start of a playbook, so the
        worker forked for each task inherits them instead of loading every plugin again.
    requirements:
      - enable in ansible.cfg (callbacks_enabled)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpucluster_prefork"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        for loader in (filter_loader, test_loader):
            for _plugin in loader.all():
                pass

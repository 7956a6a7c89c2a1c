"""Ansible's linear strategy (or Mitogen's), with the tasks that never reach a host run in the controller process.

Ansible forks a worker process for every task on every host, skipped ones included, to run that one task and
exit. For a module task the fork is a small part of the cost; for the tasks that only decide on the controller
(`assert`, `set_fact`, `debug`, `include_vars`, a role's argument check, `include_tasks`, `include_role`) it is
nearly all of it: 21-42 ms of this machine's CPU per host-task, more than half of it the kernel copying the
controller's pages, against about 5 ms to run the task itself (docs/roles.md, "Where a host-task's cost goes").
Half of a converge's host-tasks are of that kind.

This strategy runs those tasks in the controller process instead, through the same TaskExecutor a worker runs,
on private copies of the task and the play context (TaskExecutor templates both in place), and hands the result
to the same queue a worker writes to: callbacks, `register`, facts, includes and handlers see the same result
they would from a worker. A task with `until` (it may sleep between tries) or `async` always goes to a worker, so
nothing here can hold the controller's loop.

A module task whose `when` is false for a host is skipped the same way: the strategy reads the condition with the
host's variables first, and where it is false the executor runs here and records the skip. The executor reads the
condition again with the few variables it adds itself (the play context's: `ansible_user` from `-u`, ...); if
that makes it true, the executor stops at the point it would open a connection, before anything reaches the host,
and the task goes to a worker like any other. Every other task goes to a worker as before.

The base strategy is Ansible's `linear`, or the one GPUCLUSTER_STRATEGY_BASE names (`mitogen_linear`, which
`gpucluster configure` chooses where Mitogen is installed: configure/playbook.py strategy_env).
"""

from __future__ import annotations

import os

from ansible import constants as C
from ansible._internal import _task
from ansible._internal._errors import _error_utils
from ansible.executor.task_executor import TaskExecutor
from ansible.executor.task_result import _RawTaskResult
from ansible.plugins.loader import get_plugin_loader_namespace, strategy_loader
from ansible.utils.display import Display

DOCUMENTATION = """
    name: gpucluster_linear
    short_description: linear (or Mitogen's linear), with controller-only tasks run without a fork
    description:
      - Runs assert, set_fact, debug, fail, include_vars, validate_argument_spec, include_tasks and include_role,
        and a task whose when is false, in the controller process, with the same TaskExecutor and result queue
        a worker uses.
      - GPUCLUSTER_STRATEGY_BASE names the strategy it extends (default linear).
    author: gpucluster
"""

BASE_ENV = "GPUCLUSTER_STRATEGY_BASE"
# Actions that run entirely on the controller (their action plugins declare _requires_connection = False, or
# TaskExecutor returns before it makes a connection), by every name Ansible resolves them to.
IN_PROCESS = frozenset(
    [*C._ACTION_DEBUG, *C._ACTION_SET_FACT, *C._ACTION_INCLUDE_VARS, *C._ACTION_ALL_INCLUDE_ROLE_TASKS]
    + [f"{prefix}{name}" for name in ("assert", "fail", "validate_argument_spec")
       for prefix in ("", "ansible.builtin.", "ansible.legacy.")])

display = Display()
Base = strategy_loader.get(os.environ.get(BASE_ENV, "").strip() or "linear", class_only=True)


def in_process(task) -> bool:
    """True for a task this strategy runs without a worker: one of IN_PROCESS, with no until and no async."""
    return task.action in IN_PROCESS and not task.until and not task.async_val


def skipped(task, task_vars) -> bool:
    """True where the task's `when` (its blocks' and role's included) is false for this host, for a task with no
    loop (a loop's `when` is per item) and no until; any doubt (an error, a variable only a worker has) is False."""
    if not task.when or task.loop is not None or task.loop_with or task.until:
        return False
    try:
        return not task.copy()._resolve_conditional(task.when, task_vars)
    except Exception:
        return False


class NeedsWorker(BaseException):
    """Raised where a task run in the controller process would reach a host: it goes to a worker instead."""


class _NoConnection(TaskExecutor):
    def _get_connection(self, *_args, **_kwargs):
        raise NeedsWorker


class StrategyModule(Base):
    def _queue_task(self, host, task, task_vars, play_context):
        if in_process(task):
            return self._run_here(host, task, task_vars, play_context, TaskExecutor)
        if skipped(task, task_vars):
            try:
                return self._run_here(host, task, task_vars, play_context, _NoConnection)
            except NeedsWorker:  # the worker's variables made the `when` true: run it there, as linear would
                display.debug(f"{task.action} on {host.name}: not skipped after all, sent to a worker")
        return super()._queue_task(host, task, task_vars, play_context)

    def _run_here(self, host, task, task_vars, play_context, executor_class) -> None:
        # The results thread finds the task of every message by this entry, a loop item's among them, which the
        # executor sends while it runs: it must be there first.
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host, "task": task, "task_vars": task_vars, "play_context": play_context}
        own = task.copy()
        started = executor_class is TaskExecutor  # a predicted skip is announced once it is one (no loop, no items)
        if started:
            self._tqm.send_callback("v2_runner_on_start", host, task)
        result = self._execute(executor_class(host, own, task_vars, play_context.copy(), self._loader,
                                              get_plugin_loader_namespace(), self._final_q, self._variable_manager),
                               host, own)
        if not started:
            self._tqm.send_callback("v2_runner_on_start", host, task)
        self._final_q.send_task_result(_RawTaskResult(host=host, task=own, return_data=result,
                                                      task_fields=own.dump_attrs()))
        self._pending_results += 1

    @staticmethod
    def _execute(executor, host, task) -> dict:
        try:
            with _task.TaskContext(task):
                return executor.run()
        except Exception as exc:  # a worker would die with it; here the task fails and the play goes on
            display.debug(f"in-process task {task.action} on {host.name} raised {exc!r}")
            return _error_utils.result_dict_from_exception(exc)

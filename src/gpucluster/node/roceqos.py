#!/usr/bin/python3
"""gpucluster-roce-qos: apply the cluster spec's RoCE lossless settings to every RDMA device's Ethernet port.

Link MTU, DSCP trust, PFC on the RoCE priority only, the DSCP->priority map for RoCE and CNP traffic, ECN
(DCQCN) on the RoCE priority, and the default ToS of rdma_cm connections. With the vendor's mlnx_qos where it
is present, else iproute2's dcb. Safe to run again: it sets values, it does not add deltas.

  gpucluster-roce-qos [CONF]          apply (default CONF /etc/gpucluster/roce-qos.conf)
  gpucluster-roce-qos --check [CONF]  only print what would be done

One file, gpucluster.node.roceqos in the repository: the rdma role copies it as it is to
/usr/local/sbin/gpucluster-roce-qos, which gpucluster-roce-qos.service runs at boot. Standard library only.
CONF is the rendered templates/fabric/roce-qos.conf.j2 (KEY=VALUE lines). The sysfs and configfs roots can be
moved with ROCE_SYSFS, ROCE_NET_SYSFS and ROCE_CM_CONFIGFS, so the same code runs against a fake tree.

Why the steps are planned first, then carried out: the plan (port_steps) is a pure function of the settings and
one port, which the unit tests read without a NIC; --check prints it, and applying it stops at the first step
that fails (as the shell script before it did with `set -e`), so a half-configured port is reported, not hidden.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys

CONF = "/etc/gpucluster/roce-qos.conf"
SYSFS = "/sys/class/infiniband"
NET_SYSFS = "/sys/class/net"
CM_CONFIGFS = "/sys/kernel/config/rdma_cm"
# What the rendered file sets and this program reads (ROCE_DEVICES may be empty: every RDMA device).
KEYS = ("ROCE_DSCP", "ROCE_TOS", "ROCE_PFC_PRIORITY", "ROCE_PFC_MAP", "ROCE_CNP_DSCP", "ROCE_CNP_PRIORITY",
        "ROCE_ECN", "ROCE_LINK_MTU", "ROCE_TRUST")


class ConfError(Exception):
    """The settings file is missing, unreadable, or lacks a setting: nothing is applied."""


def read_conf(text: str, env: dict[str, str] | None = None, where: str = CONF) -> dict[str, str]:
    """The settings of a KEY=VALUE file (comments, blank lines and shell quoting allowed); a key the file does
    not set is taken from `env` (as a shell that sources the file would); ConfError for a line that is not an
    assignment or a setting neither gives."""
    conf = {k: v for k, v in (env or {}).items() if k.startswith("ROCE_")}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.replace("_", "").isalnum() or not key[0].isalpha():
            raise ConfError(f"{where}:{number}: not KEY=VALUE: {line[:80]!r}")
        try:
            words = shlex.split(value, comments=True)
        except ValueError as exc:
            raise ConfError(f"{where}:{number}: {key}: {exc}") from None
        conf[key] = " ".join(words)
    missing = [k for k in KEYS if k not in conf]
    if missing:
        raise ConfError(f"{where}: {', '.join(missing)} not set (render the file again: gpucluster configure)")
    return conf


def pfc_prios(pfc_map: str) -> list[str]:
    """dcb's prio-pfc words for a PFC map of eight flags ('0,0,0,1,0,0,0,0' -> ['0:off', ..., '3:on', ...])."""
    flags = pfc_map.replace(",", " ").split()
    return [f"{i}:{'on' if flag == '1' else 'off'}" for i, flag in enumerate(flags)]


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def roce_ports(sysfs: str, devices: list[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(device, port, network interface) of every Ethernet (RoCE) port of `devices` under `sysfs`, in name order,
    and a line for each device or port skipped."""
    ports, skipped = [], []
    for dev in devices:
        folder = os.path.join(sysfs, dev)
        if not os.path.isdir(folder):
            skipped.append(f"{dev}: no such RDMA device, skipped")
            continue
        try:
            names = sorted(os.listdir(os.path.join(folder, "ports")))
        except OSError:
            names = []
        for port in names:
            port_dir = os.path.join(folder, "ports", port)
            if _read(os.path.join(port_dir, "link_layer")) != "Ethernet":
                continue  # RoCE ports only
            netdev = _read(os.path.join(port_dir, "gid_attrs", "ndevs", "0"))
            if not netdev:
                skipped.append(f"{dev} port {port}: no network interface behind it, skipped")
                continue
            ports.append((dev, port, netdev))
    return ports, skipped


def port_steps(conf: dict[str, str], dev: str, port: str, netdev: str, *, mlnx_qos: bool, apptrust: bool,
               net_sysfs: str = NET_SYSFS, cm_configfs: str | None = CM_CONFIGFS) -> list[tuple]:
    """What one port takes, in order: ("run", argv), ("write", value, path) of a sysfs/configfs setting that some
    NICs lack (skipped where absent), ("mkdir", path). `mlnx_qos`: the vendor's tool is there; `apptrust`: dcb
    knows `apptrust` (older iproute2 does not); `cm_configfs`: rdma_cm's configfs root, None where it is absent."""
    prio, cnp_prio = conf["ROCE_PFC_PRIORITY"], conf["ROCE_CNP_PRIORITY"]
    steps: list[tuple] = [("run", ["ip", "link", "set", "dev", netdev, "mtu", conf["ROCE_LINK_MTU"]])]
    if mlnx_qos:
        steps.append(("run", ["mlnx_qos", "-i", netdev, "--trust", conf["ROCE_TRUST"], "--pfc", conf["ROCE_PFC_MAP"]]))
    else:
        steps.append(("run", ["dcb", "pfc", "set", "dev", netdev, "prio-pfc", *pfc_prios(conf["ROCE_PFC_MAP"])]))
        steps.append(("run", ["dcb", "app", "replace", "dev", netdev, "dscp-prio", f"{conf['ROCE_DSCP']}:{prio}",
                              f"{conf['ROCE_CNP_DSCP']}:{cnp_prio}"]))
        if apptrust:
            steps.append(("run", ["dcb", "apptrust", "set", "dev", netdev, "order", "dscp"]))
    # DCQCN: ECN reaction (rp) and notification (np) on the RoCE priority; CNPs on their own class.
    ecn = os.path.join(net_sysfs, netdev, "ecn")
    steps += [("write", conf["ROCE_ECN"], os.path.join(ecn, "roce_np", "enable", prio)),
              ("write", conf["ROCE_ECN"], os.path.join(ecn, "roce_rp", "enable", prio)),
              ("write", conf["ROCE_CNP_DSCP"], os.path.join(ecn, "roce_np", "cnp_dscp")),
              ("write", cnp_prio, os.path.join(ecn, "roce_np", "cnp_802p_prio"))]
    # rdma_cm connections (NCCL sets NCCL_IB_TC itself) default to the RoCE ToS.
    if cm_configfs is not None:
        cm_dev = os.path.join(cm_configfs, dev)
        if not os.path.isdir(cm_dev):
            steps.append(("mkdir", cm_dev))
        steps += [("write", conf["ROCE_TOS"], os.path.join(cm_dev, "ports", port, "default_roce_tos")),
                  ("write", "RoCE v2", os.path.join(cm_dev, "ports", port, "default_roce_mode"))]
    return steps


class StepFailed(Exception):
    """A command or a write failed: the settings of this port are partly applied."""

    def __init__(self, message: str, rc: int) -> None:
        super().__init__(message)
        self.rc = rc


def carry_out(step: tuple, check: bool) -> None:
    """Print one step as the operator reads it (`+ COMMAND`), and do it unless `check`."""
    kind = step[0]
    if kind == "run":
        argv = step[1]
        print("+ " + " ".join(argv), flush=True)
        if check:
            return
        try:
            rc = subprocess.run(argv, check=False).returncode
        except OSError as exc:
            raise StepFailed(f"{argv[0]}: {exc}", 127) from None
        if rc != 0:
            raise StepFailed(f"{' '.join(argv)} exited {rc}", rc)
    elif kind == "write":
        value, path = step[1], step[2]
        if not os.path.exists(path):
            print(f"  ({path} not present: skipped)")
            return
        print(f"+ echo {value} > {path}", flush=True)
        if not check:
            try:
                with open(path, "w") as fh:
                    fh.write(value + "\n")
            except OSError as exc:
                raise StepFailed(f"{path}: {exc}", 1) from None
    elif kind == "mkdir":
        print(f"+ mkdir {step[1]}", flush=True)
        if not check:
            try:
                os.mkdir(step[1])
            except OSError as exc:
                raise StepFailed(f"mkdir {step[1]}: {exc}", 1) from None
    else:
        raise ValueError(f"unknown step {kind!r}")


def _dcb_apptrust() -> bool:
    try:
        return subprocess.run(["dcb", "apptrust", "help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              check=False).returncode == 0
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpucluster-roce-qos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only print what would be done")
    parser.add_argument("conf", nargs="?", default=CONF, help=f"the settings (default {CONF})")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    sysfs = env.get("ROCE_SYSFS") or SYSFS
    net_sysfs = env.get("ROCE_NET_SYSFS") or NET_SYSFS
    cm_configfs = env.get("ROCE_CM_CONFIGFS") or CM_CONFIGFS
    try:
        with open(args.conf) as fh:
            conf = read_conf(fh.read(), env, args.conf)
    except (OSError, UnicodeError) as exc:
        print(f"gpucluster-roce-qos: cannot read {args.conf}: {exc}", file=sys.stderr)
        return 2
    except ConfError as exc:
        print(f"gpucluster-roce-qos: {exc}", file=sys.stderr)
        return 2
    try:
        present = sorted(os.listdir(sysfs))
    except OSError:
        present = []
    if not present:
        print(f"no RDMA device in {sysfs}: nothing to apply")
        return 0
    ports, skipped = roce_ports(sysfs, conf.get("ROCE_DEVICES", "").split() or present)
    for line in skipped:
        print(line, file=sys.stderr)
    mlnx_qos = shutil.which("mlnx_qos") is not None
    apptrust = not mlnx_qos and _dcb_apptrust()
    applied = 0
    for dev, port, netdev in ports:
        print(f"{dev} port {port} ({netdev}):")
        steps = port_steps(conf, dev, port, netdev, mlnx_qos=mlnx_qos, apptrust=apptrust, net_sysfs=net_sysfs,
                           cm_configfs=cm_configfs if os.path.isdir(cm_configfs) else None)
        try:
            for step in steps:
                carry_out(step, args.check)
        except StepFailed as exc:
            print(f"gpucluster-roce-qos: {dev} port {port} ({netdev}): {exc}", file=sys.stderr)
            return exc.rc
        applied += 1
    verb = "would be applied" if args.check else "applied"
    print(f"RoCE settings {verb} to {applied} port(s) (DSCP {conf['ROCE_DSCP']} -> priority "
          f"{conf['ROCE_PFC_PRIORITY']}, PFC {conf['ROCE_PFC_MAP']}, ECN {conf['ROCE_ECN']}, MTU "
          f"{conf['ROCE_LINK_MTU']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

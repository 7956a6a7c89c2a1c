# Runs inside Ansible modules on the nodes, on the node's python3.
"""File writing shared by gpucluster's Ansible modules: each file is replaced whole (a temporary file in
the same folder, fsync, then rename), and only when its bytes differ, so `changed` is honest and a
reader never sees half a file. Ansible copies this into every module that imports it."""

from __future__ import annotations

import os
import tempfile


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def atomic_write(path: str, data: bytes, mode: int = 0o644, uid: int | None = None, gid: int | None = None,
                 prefix: str = ".gpucluster-", make_dirs: bool = False) -> None:
    """Replace `path` with `data`: written beside it (mkstemp: 0600 until chmod), owner and mode set, renamed."""
    folder = os.path.dirname(path) or "."
    if make_dirs:
        os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if uid is not None or gid is not None:
            os.chown(tmp, -1 if uid is None else uid, -1 if gid is None else gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_if_changed(path: str, data: bytes, mode: int = 0o644, check_mode: bool = False,
                     uid: int | None = None, gid: int | None = None, make_dirs: bool = False,
                     prefix: str = ".gpucluster-") -> tuple[bool, bytes | None]:
    """(changed, the bytes there before or None). Content differs: replaced atomically. Same content but
    another owner or mode: fixed in place. check_mode: reports without touching anything."""
    before = read_bytes(path)
    if before != data:
        if not check_mode:
            atomic_write(path, data, mode, uid, gid, prefix=prefix, make_dirs=make_dirs)
        return True, before
    st = os.stat(path)
    want_uid = st.st_uid if uid is None else uid
    want_gid = st.st_gid if gid is None else gid
    if (st.st_uid, st.st_gid, st.st_mode & 0o7777) != (want_uid, want_gid, mode):
        if not check_mode:
            os.chown(path, want_uid, want_gid)
            os.chmod(path, mode)
        return True, before
    return False, before

"""Names other systems derive from paths: one definition each."""

from __future__ import annotations


def unit_name(path: str, suffix: str = "mount") -> str:
    """systemd's unit name for a path, as `systemd-escape --path --suffix=SUFFIX PATH` writes it."""
    trimmed = "/".join(p for p in str(path).split("/") if p)
    if not trimmed:
        return f"-.{suffix}"
    out = []
    for i, ch in enumerate(trimmed):
        if ch == "/":
            out.append("-")
        elif ch.isascii() and (ch.isalnum() or ch in ":_" or (ch == "." and i > 0)):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out) + f".{suffix}"

"""How a rendered file that can differ between node groups is named: one name when it does not."""

from __future__ import annotations


def one_or_per_group(texts: dict[str, str], name: str) -> dict[str, str]:
    """Node group -> the file name it takes. `name` (e.g. roce-qos.conf) when every group's text is the
    same, else `<stem>.<group>.<suffix>` (roce-qos.h100.conf), as nccl.conf does: one file to read in
    the common case, and no file that is right for one group and wrong for another."""
    if len(set(texts.values())) <= 1:
        return dict.fromkeys(texts, name)
    stem, dot, suffix = name.rpartition(".")
    return {group: f"{stem}.{group}{dot}{suffix}" for group in texts}

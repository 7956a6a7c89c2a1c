"""Write the diagram and the HTML plan: each file whole or not at all (a temporary file renamed)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpucluster.cluster import Cluster
from gpucluster.errors import UsageError


def _write(path: Path, text: str) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write here ({exc.strerror or exc}); choose a writable path") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{path}: writing failed ({exc.strerror or exc}); nothing was changed") from None


def write_report(cluster: Cluster, *, svg: str | None = None, html: str | None = None,
                 pod: int | None = None) -> list[Path]:
    """Render first, write after: a bad --pod or a missing dot leaves no file behind."""
    from gpucluster.report.diagram import fabric_svg
    from gpucluster.report.html import plan_html

    try:
        texts = []
        if svg:
            texts.append((Path(svg), fabric_svg(cluster.plan, pod)))
        if html:
            texts.append((Path(html), plan_html(cluster, pod)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for path, text in texts:
        _write(path, text)
    return [path for path, _text in texts]

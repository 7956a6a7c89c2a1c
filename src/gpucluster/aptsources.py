"""Find the Debian mirror this machine already uses, so staged images never name a host in code.

The machines that build staged nodes reach only the package mirror their own apt sources name;
reading it at run time keeps the toolkit portable between a developer's mirror, CI and a site proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpucluster.errors import OperationError

APT_DIR = Path("/etc/apt")
# The host's own release (Debian 12): its mirror is the one the apt sources must name. Other suites
# (trixie for Debian 13 nodes, sid for the newest Slurm) are read from the same mirror.
SUITE = "bookworm"
COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]


@dataclass(frozen=True)
class DebianMirror:
    """The mirror for one suite, plus the security archive and -updates when the host has them."""

    uri: str
    security_uri: str | None
    updates: bool
    suite: str = SUITE

    def sources_deb822(self) -> str:
        """The apt sources a staged node gets: the host's mirror with every Debian component."""
        suites = [self.suite] + ([f"{self.suite}-updates"] if self.updates else [])
        comps = " ".join(COMPONENTS)
        text = (
            f"Types: deb\nURIs: {self.uri}\nSuites: {' '.join(suites)}\n"
            f"Components: {comps}\nSigned-By: {KEYRING}\n"
        )
        if self.security_uri:
            text += (
                f"\nTypes: deb\nURIs: {self.security_uri}\nSuites: {self.suite}-security\n"
                f"Components: {comps}\nSigned-By: {KEYRING}\n"
            )
        return text


def _parse_deb822(text: str) -> list[AptSource]:
    sources: list[AptSource] = []
    for stanza in _stanzas(text):
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        if "deb" not in stanza.get("types", "").split():
            continue
        uris = stanza.get("uris", "").split()
        if uris:
            sources.append(AptSource(uris[0].rstrip("/"), tuple(stanza.get("suites", "").split())))
    return sources


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
            continue
        if line[0] in " \t" and key:
            cur[key] += " " + line.strip()
        elif ":" in line:
            k, _, v = line.partition(":")
            key = k.strip().lower()
            cur[key] = v.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def _parse_one_line(text: str) -> list[AptSource]:
    sources: list[AptSource] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            sources.append(AptSource(words[0].rstrip("/"), (words[1],)))
    return sources


def host_sources(apt_dir: Path = APT_DIR) -> list[AptSource]:
    sources: list[AptSource] = []
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if path.is_file():
            sources += _parse_one_line(path.read_text(errors="replace"))
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        sources += _parse_deb822(path.read_text(errors="replace"))
    return sources


def debian_mirror(apt_dir: Path = APT_DIR, suite: str = SUITE) -> DebianMirror:
    """The host's Debian mirror for `suite`; OperationError when the apt sources name none.

    A suite the host's sources do not list (a Debian 12 host building Debian 13 nodes) is read from the
    mirror they list for the host's own release, the archive and security URIs alike: one Debian mirror
    serves every suite, and the host's sources are the only place this toolkit may learn its address.
    Its -updates follow the host's own (a host that takes bookworm-updates gets trixie-updates).
    """
    sources = host_sources(apt_dir)
    own = next((s for s in sources if suite in s.suites), None)
    host = own or next((s for s in sources if SUITE in s.suites), None)
    if host is None:
        wanted = suite if suite == SUITE else f"{suite}' or '{SUITE}"
        raise OperationError(
            f"no Debian '{wanted}' mirror found in {apt_dir}/sources.list or "
            f"{apt_dir}/sources.list.d/: staged images are built from the mirror the host's apt "
            f"sources name; add a 'deb <mirror> {SUITE} main' source"
        )
    base = suite if own is not None else SUITE
    security = next((s.uri for s in sources if f"{base}-security" in s.suites), None)
    updates = any(f"{base}-updates" in s.suites for s in sources)
    return DebianMirror(uri=host.uri, security_uri=security, updates=updates, suite=suite)

"""JUnit results -> one merged report, a one-screen summary and a self-contained HTML page.

Every check records its inventory group, host and item as JUnit properties (checks/conftest.py), so
results from the SSH run and from every node of a --via-slurm job merge into one table.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.words import plural

OUTCOMES = ("passed", "failed", "skipped", "differs")
_ID = re.compile(r"^(?P<test>[^\[]+)\[(?P<group>[^:\]]+):(?P<host>[^:\]]+)(?::(?P<item>.*))?\](?:@.*)?$")


@dataclass
class Result:
    test: str
    group: str
    host: str
    item: str | None
    outcome: str  # passed, failed, skipped, differs (an expected difference: xfail)
    message: str = ""
    details: str = ""
    seconds: float = 0.0
    source: str = ""

    @property
    def name(self) -> str:
        return f"{self.test}[{self.item}]" if self.item else self.test


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    title: str = ""

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.outcome == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed and bool(self.results)

    def counts_by_group(self) -> dict[str, Counter]:
        out: dict[str, Counter] = defaultdict(Counter)
        for r in self.results:
            out[r.group][r.outcome] += 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1]["failed"], kv[0])))

    def hosts_ordered(self) -> list[tuple[str, Counter]]:
        """Hosts with failures first (most failures first), then the rest by name."""
        per: dict[str, Counter] = defaultdict(Counter)
        for r in self.results:
            per[r.host][r.outcome] += 1
        return sorted(per.items(), key=lambda kv: (-kv[1]["failed"], kv[0]))

    def skip_reasons(self) -> list[tuple[str, int, list[str]]]:
        """Skips grouped by reason (the host name taken out, so one reason covers many hosts)."""
        by: dict[str, list[str]] = defaultdict(list)
        for r in self.results:
            if r.outcome == "skipped":
                by[_generic(r.message, r.host)].append(r.host)
        return sorted(((k, len(v), sorted(set(v))) for k, v in by.items()), key=lambda x: -x[1])

    def differences(self) -> list[str]:
        return sorted({_generic(r.message, r.host) for r in self.results if r.outcome == "differs"})


def _generic(message: str, host: str) -> str:
    text = message.strip()
    if text.startswith(f"{host}: "):
        text = text[len(host) + 2:]
    text = re.sub(r"^Skipped: ", "", text)
    text = re.sub(r"^\[XPASS\(strict\)\] |^reason: ", "", text)
    return text.split("\n")[0]


def _props(tc: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in tc.iter("property")}


def parse_junit(path: Path, source: str = "") -> list[Result]:
    root = ET.parse(path).getroot()
    out: list[Result] = []
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = [(tc, suite.get("name")) for suite in suites for tc in suite.iter("testcase")]
    for tc, suite_name in cases:
        name = tc.get("name", "")
        props = _props(tc)
        m = _ID.match(name)
        test = m.group("test") if m else name.split("[")[0]
        group = props.get("group") or (m.group("group") if m else "?")
        host = props.get("host") or (m.group("host") if m else "?")
        item = props.get("item") or (m.group("item") if m else None)
        outcome, message, details = "passed", "", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is None:
                continue
            message = el.get("message", "") or ""
            details = (el.text or "").strip()
            outcome = "failed"
            if tag == "skipped":
                outcome = "differs" if el.get("type") == "pytest.xfail" else "skipped"
            break
        if outcome == "failed":
            phase = None
            m = re.match(r'^failed on (setup|teardown) with "(.*)"$', message, re.S)
            if m:
                phase, message = m.group(1), m.group(2)
            message = _failure_text(message, details if not phase else "")
            if phase and not message.startswith(f"{host}: "):
                message = f"{host}: error in {phase}: {message}"
        out.append(Result(test=test, group=group, host=host, item=item, outcome=outcome, message=message,
                          details=details, seconds=float(tc.get("time") or 0),
                          source=source or suite_name or path.stem))
    return out


def _failure_text(message: str, details: str) -> str:
    """The assertion's own words: pytest's 'AssertionError: ...' line, without the 'assert x == y' echo.
    pytest cuts long messages in the attribute ('[+N more lines; ...]'); the element text has them whole."""
    text = message or details
    if re.search(r"\[\+\d+ more lines?; full report in element text\]", text) and details:
        text = _e_lines(details) or details
    text = re.sub(r"^(?:[\w.]*\.)?(?:AssertionError|Failed|Unreachable): ", "", text)
    text = text.split("\nassert ")[0]
    first, *rest = text.strip().split("\n")
    if rest and all(line.startswith("  ") or not line for line in rest):
        rest = [line[2:] for line in rest]  # pytest indents an exception's continuation lines by two
    return "\n".join([first, *rest]).strip()


def _e_lines(traceback: str) -> str:
    """The exception text of a pytest traceback (its 'E   ' lines), without the traceback around it."""
    lines = [line for line in traceback.splitlines() if line.startswith("E ")]
    out = []
    for i, line in enumerate(lines):
        body = line[4:] if line.startswith("E   ") else line[2:]
        out.append(body[2:] if i and body.startswith("  ") else body)
    return "\n".join(out)


def merge_junit(inputs: list[tuple[Path, str]], out: Path) -> Path:
    """One <testsuites> holding every input's suites, each renamed after where it ran."""
    top = ET.Element("testsuites", name="gpucluster validate")
    totals = Counter()
    for path, source in inputs:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for s in suites:
            s.set("name", source)
            for k in ("tests", "failures", "errors", "skipped"):
                totals[k] += int(s.get(k) or 0)
            top.append(s)
    for k, v in totals.items():
        top.set(k, str(v))
    out.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(top).write(out, encoding="utf-8", xml_declaration=True)
    return out


def _hostlist(hosts: list[str]) -> str:
    try:
        import hostlist

        return hostlist.collect_hostlist(hosts)
    except (ImportError, ValueError):
        return ",".join(hosts)


def summary_text(rep: Report, width: int = 100, max_failures: int = 12, max_hosts: int = 8) -> str:
    """The one-screen summary: failing hosts first, counts per group, skip reasons, differences."""
    lines: list[str] = []
    c = Counter(r.outcome for r in rep.results)
    hosts = rep.hosts_ordered()
    lines.append(f"{rep.title}: {plural(len(rep.results), 'check')} on {plural(len(hosts), 'host')} in "
                 f"{rep.seconds:.1f} s - " + ", ".join(f"{c[o]} {o}" for o in OUTCOMES if c[o]))
    failing = [(h, n) for h, n in hosts if n["failed"]]
    if failing:
        lines.append("")
        lines.append(f"FAILING HOSTS ({len(failing)}):")
        shown = 0
        for host, n in failing[:max_hosts]:
            lines.append(f"  {host}: {n['failed']} failed")
            for r in [r for r in rep.failed if r.host == host]:
                if shown >= max_failures:
                    break
                first = r.message.splitlines()[0] if r.message else "(no message)"
                lines.append(_clip(f"    {r.name} [{r.group}]: {first}", width))
                shown += 1
        if len(failing) > max_hosts:
            rest = [h for h, _n in failing[max_hosts:]]
            lines.append(_clip(f"  ... {len(rest)} more failing hosts: {_hostlist(rest)}", width))
        if len(rep.failed) > shown:
            lines.append(f"    ... {len(rep.failed) - shown} more failed checks in the report")
        if len(failing) > 1:
            by_check: dict[str, list[str]] = defaultdict(list)
            for r in rep.failed:
                by_check[r.name].append(r.host)
            lines.append("  by check:")
            for name, on in sorted(by_check.items(), key=lambda kv: -len(kv[1]))[:5]:
                lines.append(_clip(f"    {name}: {len(on)} host(s) {_hostlist(sorted(set(on)))}", width))
    lines.append("")
    lines.append(f"  {'group':<20}{'passed':>8}{'failed':>8}{'skipped':>9}{'differs':>9}")
    for group, n in rep.counts_by_group().items():
        mark = "  <-" if n["failed"] else ""
        lines.append(f"  {group:<20}{n['passed']:>8}{n['failed']:>8}{n['skipped']:>9}{n['differs']:>9}{mark}")
    reasons = rep.skip_reasons()
    if reasons:
        lines.append("")
        lines.append("skipped, with reasons:")
        for reason, count, on in reasons[:8]:
            where = ", ".join(on[:4]) + (f" +{len(on) - 4}" if len(on) > 4 else "")
            lines.append(_clip(f"  {count:>4} x {reason}  ({where})", width))
        if len(reasons) > 8:
            lines.append(f"  ... {len(reasons) - 8} more reasons in the report")
    diffs = rep.differences()
    if diffs:
        lines.append("")
        lines.append("differs from production (reported, not passed):")
        for d in diffs:
            lines.append(_clip(f"  {d}", width))
    for note in rep.notes:
        lines.append(_clip(f"note: {note}", width))
    lines.append("")
    lines.append(("FAILED" if rep.failed else "PASSED" if rep.results else "NOTHING RAN")
                 + (f": {len(rep.failed)} failed check(s) on {len(failing)} host(s)" if rep.failed else ""))
    return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_html(rep: Report) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
                      autoescape=select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    by_host: dict[str, list[Result]] = defaultdict(list)
    order = {"failed": 0, "differs": 1, "skipped": 2, "passed": 3}
    for r in rep.results:
        by_host[r.host].append(r)
    for v in by_host.values():
        v.sort(key=lambda r: (order.get(r.outcome, 9), r.group, r.name))
    c = Counter(r.outcome for r in rep.results)
    return env.get_template("report.html.j2").render(
        rep=rep, counts=c, groups=rep.counts_by_group(), hosts=rep.hosts_ordered(), by_host=by_host,
        reasons=rep.skip_reasons(), diffs=rep.differences(), outcomes=OUTCOMES)


def write_html(rep: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(rep), encoding="utf-8")
    return path

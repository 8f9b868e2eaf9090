"""The numbers the documentation quotes, refreshed from the files the code writes.

A document quotes a number between markers naming where it comes from:

    <!--n:fig:overload/vtc/throughput_tok_s-->893.8<!--/n-->
    <!--n:bench:sim/overload vtc/requests_per_s|,.0f-->2,753<!--/n-->

`SOURCE:PATH[|FORMAT]`: SOURCE is one of SOURCES (a JSON file), PATH walks its keys (separated by
`/`), FORMAT is a Python format spec (default: the value as the JSON holds it). A generated
markdown fragment is included whole between block markers:

    <!--include:figures/tables/real_linear.md-->
    ...
    <!--/include-->

`refresh_docs` rewrites what lies between the markers; `slora-vtc docs --check` (and a test)
fails when a committed document disagrees with the files.
"""

import json
import re
from pathlib import Path

from slora_vtc.data import REPO_ROOT
from slora_vtc.errors import UserError

SOURCES = {
    "fig": "figures/numbers.json",  # slora-vtc figures
    "bench": "benchmarks/results/cpu.json",  # benchmarks/run.py
    "decode": "benchmarks/results/cpu_decode.json",  # benchmarks/cpu_decode.py
    "cluster": "benchmarks/results/cluster_scale.json",  # benchmarks/cluster_scale.py
    "http": "benchmarks/results/http_load.json",  # benchmarks/http_load.py
    "gateway": "benchmarks/results/gateway_overhead.json",  # benchmarks/gateway_overhead.py
    "gateway_vllm": "benchmarks/results/gateway_vllm.json",  # benchmarks/gateway_vllm.py
    "metrics": "benchmarks/results/metrics_scrape.json",  # benchmarks/metrics_scrape.py
    "refsim": "benchmarks/results/refsim_ratio.json",  # benchmarks/refsim_ratio.py
    "tests": "benchmarks/results/test_times.json",  # benchmarks/test_times.py
    "vplugin": "benchmarks/results/vllm_plugin.json",  # benchmarks/vllm_plugin.py (in .venv-vllm)
    "setups": "benchmarks/results/vllm_setups.json",  # benchmarks/vllm_compare.py (needs vLLM)
    "vsteps": "benchmarks/results/vllm_steps.json",  # benchmarks/vllm_steps.py (its runs need vLLM)
    "vfid": "benchmarks/results/vllm_fidelity.json",  # scripts/vllm_fidelity.py (needs vLLM)
    "voff": "benchmarks/results/vllm_plugin_offline.json",  # benchmarks/vllm_plugin_offline.py (in .venv-vllm)
    "vsvllm": "benchmarks/results/serve_vs_vllm.json",  # benchmarks/serve_vs_vllm.py
    "burst": "benchmarks/results/engine_burst.json",  # benchmarks/engine_burst.py
    "chunked": "benchmarks/results/chunked_speed.json",  # benchmarks/chunked_speed.py
    "chunked_before": "benchmarks/results/chunked_speed_before.json",  # the same, before this work (806015a)
    "lean": "benchmarks/results/chunked_lean.json",  # benchmarks/chunked_lean.py
    "paper": "data/paper/reported.json",  # what the paper reports (typed from it, with sources)
    "dlpm": "data/paper/dlpm_reported.json",  # what the DLPM paper reports
}
DOCS = (
    "README.md",
    "paper_repro.md",
    "benchmarks/README.md",
    "docs/design.md",
    "docs/extending.md",
    "docs/beyond.md",
    "docs/gateway.md",
    "docs/vllm.md",
)

# a key or a format may hold any character but "|" (the key's end) and the comment's end "-->"
NUMBER = re.compile(r"<!--n:(?P<key>(?:(?!-->)[^|])+?)(?:\|(?P<fmt>(?:(?!-->).)*))?-->(?P<text>.*?)<!--/n-->", re.S)
OPENING = re.compile(r"<!--n:")
INCLUDE = re.compile(r"(?P<open><!--include:(?P<path>[^>]+?)-->\n)(?P<text>.*?)(?P<close><!--/include-->)", re.S)


class Numbers:
    """The JSON files of SOURCES under one root, each read once."""

    def __init__(self, root: Path = REPO_ROOT):
        self.root = root
        self._files: dict[str, object] = {}

    def lookup(self, key: str, where: str):
        source, sep, path = key.partition(":")
        if not sep or source not in SOURCES:
            raise UserError(f"{where}: number '{key}' names no source (known: {', '.join(SOURCES)})")
        value = self._file(source)
        for part in path.split("/"):
            if (
                isinstance(value, dict) and part not in value and "value" in value
            ):  # the paper's entries: descend into the value
                value = value["value"]
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise UserError(f"{where}: {SOURCES[source]} has no '{path}' (stopped at '{part}')")
        if isinstance(value, dict) and "value" in value:  # the paper's entries carry their source beside the value
            value = value["value"]
        return value

    def _file(self, source: str):
        if source not in self._files:
            path = self.root / SOURCES[source]
            if not path.is_file():
                raise UserError(f"{path} is missing (regenerate it: `make figures` or `make bench`)")
            self._files[source] = json.loads(path.read_text())
        return self._files[source]


def refresh_docs(paths: list[Path], write: bool = True, root: Path = REPO_ROOT) -> list[Path]:
    """The documents whose quoted numbers differ from the files (rewritten when `write`)."""
    numbers, stale = Numbers(root), []
    for path in paths:
        path = path if path.is_absolute() else root / path
        if not path.exists():
            continue
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: cannot read it as text ({e})") from None
        fresh = refresh_text(text, numbers, str(path.relative_to(root)) if path.is_relative_to(root) else str(path))
        if fresh != text:
            stale.append(path)
            if write:
                path.write_text(fresh)
    return stale


def refresh_text(text: str, numbers: Numbers, where: str = "document") -> str:
    def number(m: re.Match) -> str:
        value = numbers.lookup(m["key"].strip(), f"{where}:{_line(text, m.start())}")
        return (
            f"<!--n:{m['key']}{'|' + m['fmt'] if m['fmt'] is not None else ''}-->"
            f"{_format(value, m['fmt'], where)}<!--/n-->"
        )

    def include(m: re.Match) -> str:
        path = numbers.root / m["path"].strip()
        if not path.is_file():
            raise UserError(f"{where}:{_line(text, m.start())}: included file {m['path']} does not exist")
        body = path.read_text()
        return m["open"] + body + ("" if body.endswith("\n") else "\n") + m["close"]

    read = {m.start() for m in NUMBER.finditer(text)}
    for m in OPENING.finditer(text):
        if m.start() not in read:
            raise UserError(f"{where}:{_line(text, m.start())}: a number's marker is not KEY[|FORMAT]-->TEXT<!--/n-->")
    return NUMBER.sub(number, INCLUDE.sub(include, text))


def _format(value, fmt: str | None, where: str) -> str:
    if fmt is None or fmt == "":
        return str(value)
    try:
        return format(value, fmt)
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: cannot format {value!r} with '{fmt}' ({e})") from None


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1

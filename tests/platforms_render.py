"""Render ``docs/platforms.md`` from the results ``tests/platforms_plugin.py`` collected.

    python -m tests.platforms_render .ql-platforms/results.json > docs/platforms.md

Deterministic: counts and names only (no times, no host names, no kernel release), so a full run on
the same kind of machine renders the same bytes.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from typing import Any

__all__ = ["render"]

LAUNCHER_COLUMNS = [
    "signals",
    "exit codes + publication",
    "ENOSPC (tmpfs)",
    "busybox-only PATH",
    "token secrecy",
    "host SIGKILL",
    "identity: proc",
    "identity: psutil",
]

NOT_PROVEN = [
    "**musl**: Debian 12 packages no musl-linked dash, bash or busybox (its `busybox-static` is "
    "static glibc; `mksh-static` is klibc and not a launcher shell), so no musl row exists.",
    "**Real ARM64 hardware**: AArch64 runs under qemu-user here: the launcher and the busybox "
    "applets it runs in-process (`ln`, `rm`, `sync`, `date`) are AArch64 code; the kernel, and "
    "commands started from `PATH`, are the host's.",
    "**Recovery beyond Linux**: the psutil identity source is proven by forcing it on Linux "
    "(`QL_IDENTITY_SOURCE=psutil`); no macOS or BSD machine ran it.",
    "**Power loss on real hardware**: the replay is a model (see `tests/powerloss/crash_model.py`) "
    "applied to real recorded operations; it does not cut power.",
]


def _cell(counts: Counter[str]) -> str:
    total = sum(counts.values())
    if not total:
        return "—"
    text = f"{counts['passed']}/{total}"
    if counts["skipped"]:
        text += f" ({counts['skipped']} skipped)"
    if counts["failed"]:
        text += f" **{counts['failed']} FAILED**"
    return text


def render(results: dict[str, Any]) -> str:
    tests: list[dict[str, Any]] = results["tests"]
    out = [
        "# Declared platforms (generated)",
        "",
        "What the test suite proved where, rendered from the last full run (`python -m pytest`, "
        "as `.ci/run` runs it) by `tests/platforms_plugin.py` and `tests/platforms_render.py`. "
        "Do not edit by hand: `QL_PLATFORMS_UPDATE=1 python -m pytest` rewrites it, and under "
        "`CI=true` a full run fails when this file does not match it. Cells are passed/total tests; "
        "a skip always carries its reason in the pytest output.",
        "",
        "Host kernel features: "
        + "; ".join(f"{k}: {v}" for k, v in sorted(results["features"].items()))
        + ".",
        "",
        "## Launcher: architecture × shell × libc",
        "",
        "Mode is the launcher's start mode with the host `PATH` (docs/launcher.md): `async` where GNU "
        "`env --default-signal` exists, `foreground` without it. The busybox-only column runs every "
        "shell with a `PATH` of busybox applets only, so in foreground mode. The `compiled` row is "
        "launcher.c as this machine's C compiler built it (no shell: it resets signals itself, so "
        "always async, and has no busybox-only column); `compiled-standby` is the same binary started "
        "as a standby before its run and handed the run in one message (the executor's default); "
        "`compiled-factory` is a standby forked by the launcher's `--factory` instead of exec'd (what "
        "the executor uses from its second task on); `compiled-aarch64` is the launcher shipped in the AArch64 wheel (`tools/build_wheels.sh`, "
        "Debian's cross compiler), run by qemu-user.",
        "",
    ]
    rows: dict[tuple[str, ...], dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for t in tests:
        if t["shell"] != "-" and t["group"] in LAUNCHER_COLUMNS:
            key = (t["arch"], t["shell"], t["version"], t["libc"], t["mode"])
            rows[key][t["group"]][t["outcome"]] += 1
    out.append("| arch | shell | version | libc | mode | " + " | ".join(LAUNCHER_COLUMNS) + " |")
    out.append("|" + "---|" * (5 + len(LAUNCHER_COLUMNS)))
    for key in sorted(rows):
        cells = [_cell(rows[key][c]) for c in LAUNCHER_COLUMNS]
        out.append("| " + " | ".join([*key, *cells]) + " |")

    out += ["", "## Process identity without a launcher shell", ""]
    ident: dict[str, Counter[str]] = defaultdict(Counter)
    for t in tests:
        if t["shell"] == "-" and t["group"].startswith("identity"):
            ident[t["group"]][t["outcome"]] += 1
    out.append("| source | arch | tests |")
    out.append("|---|---|---|")
    arch = next((t["arch"] for t in tests if t["shell"] == "-"), "?")
    for group in sorted(ident):
        out.append(f"| {group.removeprefix('identity: ')} | {arch} | {_cell(ident[group])} |")

    out += ["", "## Power-loss approximation (crash-state replay)", ""]
    out.append("Each row: one real recording (strace) of a task's log append and its launcher's "
               "publication, every crash state the model allows, real recovery on each "
               "(`tests/powerloss/`). `executor` is the production path (the runtime's executor with its "
               "defaults: the compiled launcher, as a standby, where it can be built); the other rows "
               "re-publish the same attempt with the launcher alone.")
    out.append("")
    out.append("| arch | launcher | replay | crash states | outcomes | test |")
    out.append("|---|---|---|---|---|---|")
    replay: dict[str, Counter[str]] = defaultdict(Counter)
    rows_pl = []
    for t in tests:
        if t["group"].startswith("power-loss"):
            replay[t["group"]][t["outcome"]] += 1
            info = t["extra"].get("powerloss")
            if info:
                outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(info["outcomes"].items()))
                launcher = "executor (its default launcher)" if t["shell"] == "-" else t["shell"]
                rows_pl.append(f"| {t['arch']} | {launcher} | {info['variant']} | {info['states']} "
                               f"| {outcomes} | {_cell(Counter([t['outcome']]))} |")
    out += sorted(rows_pl)
    out.append("")
    for group in sorted(replay):
        out.append(f"All tests of {group}: {_cell(replay[group])}.")
        out.append("")
    out.pop()

    out += ["", "## Not proven here", ""]
    out += [f"- {line}" for line in NOT_PROVEN]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(render(json.load(f)))

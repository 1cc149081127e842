"""A full file system never yields a visible receipt and never changes the exit code (ADR gate 14)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Launcher

pytestmark = pytest.mark.root


def _fill_blocks(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 1024)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _fill_inodes(directory: Path) -> None:
    n = 0
    try:
        while True:
            (directory / f"filler{n}").touch()
            n += 1
    except OSError as exc:
        assert exc.errno == errno.ENOSPC


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []
    try:
        yield mounted
    finally:
        for path in mounted:
            if subprocess.run(["umount", str(path)], check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.parametrize(
    ("options", "fill"),
    [("size=16k", _fill_blocks), ("size=1m,nr_inodes=8", _fill_inodes)],
    ids=["no-space", "no-inodes"],
)
def test_enospc_publishes_nothing_and_keeps_exit_code(
    launcher: Launcher, mounts: list[Path], options: str, fill: Callable[[Path], None]
) -> None:
    before: list[str] = []

    def full_shard(shard: Path, _: str) -> None:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(shard)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounts.append(shard)
        fill(shard)
        # Listed before the launcher starts: a slow one (qemu, a loaded machine) may be holding its
        # temporary receipt at any later moment, until it finds the shard full and removes it.
        before.extend(sorted(os.listdir(shard)))

    task = launcher.start(["sh", "-c", "echo ran; exit 7"], prepare=full_shard)
    assert task.wait() == 7
    assert task.log() == b"ran\n"
    # Neither a final receipt nor a temp file: the shard holds exactly the filler.
    assert sorted(os.listdir(task.shard_dir)) == before
    assert all(name.startswith("filler") for name in before)

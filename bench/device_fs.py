"""What a block device receives: a fresh ext4 file system on a loop device, and its written sectors.

    with DeviceFs(Path("/var/tmp")) as fs:      # needs root, losetup, mkfs.ext4
        before = fs.written()                   # bytes the device has received so far
        ...                                     # write under fs.mount
        per_run = fs.written() - before

Why (issue 25 item 1): ``write_bytes`` of ``/proc/PID/io`` counts page-cache folios as they are
dirtied, and on kernels whose page cache holds large folios for ext4 files the same code measured
22.6-36.1 KB per task from run to run. The device's own counter (``/sys/block/loopN/stat``, sectors
written) counts what reaches the disk after the file system's work: data blocks as written back,
the ext4 journal's blocks (metadata of growing files, new files and directories), the checkpoint's
database writes — literally the wear on an SD card. :meth:`written` first runs ``syncfs`` on the
file system (``sync -f``), so every dirty page and the running journal transaction are on the
device when it reads the counter.

The file system is made for the measurement and nothing else uses it: ``mkfs.ext4`` with the inode
tables and journal initialised up front (``lazy_itable_init=0,lazy_journal_init=0``: no background
zeroing thread writes to the device meanwhile), 4 KiB blocks, a journal, mounted with the defaults
(``relatime``, ``data=ordered``) — what a Linux SD card usually has. The image file lives in
``parent`` (sparse); the loop device, mount and image are removed on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["DeviceFs", "device_fs_available"]


def device_fs_available() -> str | None:
    """None when a loop-device file system can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount", "sync"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    return None


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


class DeviceFs:
    """A fresh ext4 file system on a loop device (context manager); see the module docstring."""

    def __init__(self, parent: Path, size_mib: int = 2048) -> None:
        self.parent = parent
        self.size_mib = size_mib
        self.mount: Path | None = None
        self._image: Path | None = None
        self._device: str | None = None
        self._old_term: object = None

    def __enter__(self) -> "DeviceFs":
        # A SIGTERM unwinds like Ctrl-C, so the mount, the loop device and the image go with the run.
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, _interrupt)
        home = Path(tempfile.mkdtemp(dir=self.parent, prefix="ql-devfs-"))
        self._image = home / "fs.img"
        with open(self._image, "wb") as image:
            image.truncate(self.size_mib << 20)
        try:
            subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                            str(self._image)], check=True, capture_output=True)
            self._device = subprocess.run(["losetup", "--find", "--show", str(self._image)], check=True,
                                          capture_output=True, text=True).stdout.strip()
            self.mount = home / "mnt"
            self.mount.mkdir()
            subprocess.run(["mount", self._device, str(self.mount)], check=True, capture_output=True)
            os.chmod(self.mount, 0o1777)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def device(self) -> str:
        """The loop device (``/dev/loopN``)."""
        assert self._device is not None
        return self._device

    def written(self) -> int:
        """Bytes written to the device so far, after a ``syncfs`` of the file system."""
        assert self.mount is not None and self._device is not None
        subprocess.run(["sync", "-f", str(self.mount)], check=True)
        stat = Path(f"/sys/block/{Path(self._device).name}/stat").read_text().split()
        return int(stat[6]) * 512  # field 7: sectors written, always in 512-byte units

    def __exit__(self, *_exc: object) -> None:
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None
        if self.mount is not None and self.mount.is_mount():
            subprocess.run(["umount", str(self.mount)], check=False, capture_output=True)
        if self._device is not None:
            subprocess.run(["losetup", "-d", self._device], check=False, capture_output=True)
            self._device = None
        if self._image is not None:
            shutil.rmtree(self._image.parent, ignore_errors=True)
            self._image = None
        self.mount = None

"""A host that restored SIGPIPE's default action (as many CLIs do) and whose classic launcher is
SIGKILLed right before its go-ahead: it must survive (tests/truth/test_standby_hurt.py).

    python sigpipe_host.py DATA_DIR MARKER AWAITED(0|1)

Prints one JSON line: the run's status, reason and exit code, and the next task's status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from ql_core.config import load_config
from ql_core.runtime import Runtime


def main() -> None:
    data_dir, marker, awaited = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a write to a dead reader now kills us
    config = load_config(data_dir=data_dir, environ={}, cwd=data_dir)
    rt = Runtime.open(dataclasses.replace(config, plugin_settings={"local": {"standby": False}}))
    real_release = rt.executor.release

    def release(task):  # the launcher dies between its handle commit and its go-ahead
        pid = task.live.process.pid
        os.kill(pid, signal.SIGKILL)
        while Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
            time.sleep(0.001)
        real_release(task)

    rt.executor.release = release
    sub = rt.submit(["sh", "-c", f'touch "{marker}"; exit 3'], awaited=awaited)
    rt.executor.release = real_release
    view = rt.wait(sub)
    after = rt.wait(rt.submit(["true"], awaited=awaited)).status
    print(json.dumps({"status": view.status, "reason": view.reason, "exit_code": view.exit_code, "after": after,
                      "terminal": sum(1 for e in rt.events(sub.run_id) if e.type.startswith("run.")
                                      and e.type != "run.created")}))
    rt.close()


if __name__ == "__main__":
    main()

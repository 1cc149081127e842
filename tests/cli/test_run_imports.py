"""The start-up of a one-shot ``ql run`` (issue 25 item 3: its CPU is mostly imports).

A later ``ql run -- true`` on the plain edge configuration pays for the modules that submit, wait
and complete a task, and nothing else: no entry-point scan (the plugin cache answers), no ORM or
migration machinery, no supervisor, metrics or web module, no dataclass it does not use, no argparse
(a plain ``ql run -- CMD`` is read without the parser), no canceller
(a run without a deadline has no deadline to enforce, and nobody asked to cancel it). The
``ql`` executable starts it with the cyclic garbage collector off and turns it back on before the
wait, which may last as long as the task.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import run_ql

#: Runs ``main()`` in-process, then names every module it imported that a run must not need.
PROBE = ("import sys\n"
         "from ql_core.cli.main import main\n"
         "rc = main(sys.argv[1:])\n"
         "heavy = ('sqlalchemy', 'sqlmodel', 'alembic', 'pydantic', 'psycopg', 'loguru', 'asyncio', 'stevedore',\n"
         "         'email', 'concurrent', 'multiprocessing', 'argparse', 'gettext')\n"
         "ours = ('importlib.metadata', 'ql_core.plugin_records', 'ql_core.supervisor', 'ql_core.follow',\n"
         "        'ql_core.metrics', 'ql_core.audit', 'ql_core.web', 'ql_core.cli.quick_read', 'ql_core.cli.run_many',\n"
         "        'ql_core.db.migrations', 'ql_plugins.cluster_fenced', 'ql_core.reconciler',\n"
         "        'ql_core.cancellation', 'ql_core.cli.parser')\n"
         "found = sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(ours))\n"
         "sys.stderr.write('HEAVY=' + ','.join(found) + '\\n')\n"
         "sys.exit(rc)\n")


def test_a_later_ql_run_imports_only_what_runs_the_task(ql_env: dict[str, str]) -> None:
    first = run_ql(["run", "--", "true"], ql_env)  # the data dir's first use; it fills the plugin cache
    assert first.returncode == 0, first.stderr
    # The same interpreter and import path as the probe: the cache entry the probe looks up.
    warm = subprocess.run([sys.executable, "-c", PROBE, "run", "--", "true"], env=ql_env, capture_output=True,
                          text=True, timeout=60)
    assert warm.returncode == 0, warm.stderr
    out = subprocess.run([sys.executable, "-c", PROBE, "run", "--", "true"], env=ql_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    heavy = [line for line in out.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy == ["HEAVY="], out.stderr


#: The ``ql`` executable's path (``console_main``), reporting whether the garbage collector was on
#: when the task was submitted and when the wait began.
GC_PROBE = ("import gc, sys\n"
            "import ql_core.runtime as runtime\n"
            "def spy(name):\n"
            "    real = getattr(runtime.Runtime, name)\n"
            "    def call(self, *a, **k):\n"
            "        sys.stderr.write(f'GC_AT_{name.upper()}={gc.isenabled()}\\n')\n"
            "        return real(self, *a, **k)\n"
            "    setattr(runtime.Runtime, name, call)\n"
            "spy('submit'); spy('wait')\n"
            "from ql_core.cli.main import console_main\n"
            "sys.argv = ['ql'] + sys.argv[1:]\n"
            "console_main()\n")


def test_ql_run_starts_without_the_garbage_collector_and_waits_with_it(ql_env: dict[str, str]) -> None:
    out = subprocess.run([sys.executable, "-c", GC_PROBE, "run", "--", "sh", "-c", "exit 3"], env=ql_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    seen = [line for line in out.stderr.splitlines() if line.startswith("GC_AT_")]
    assert seen == ["GC_AT_SUBMIT=False", "GC_AT_WAIT=True"], out.stderr


def test_other_commands_and_in_process_callers_keep_the_garbage_collector(ql_env: dict[str, str]) -> None:
    probe = ("import gc, sys\n"
             "from ql_core.cli.main import main\n"
             "rc = main(sys.argv[1:])\n"
             "sys.stderr.write(f'GC={gc.isenabled()} FROZEN={gc.get_freeze_count()}\\n')\n"
             "sys.exit(rc)\n")
    for args in (["run", "--", "true"], ["--json", "list"], ["logs", "--follow", "last"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], env=ql_env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert "GC=True FROZEN=0" in out.stderr.splitlines(), out.stderr


def test_ql_logs_follows_with_the_garbage_collector_on(ql_env: dict[str, str]) -> None:
    assert run_ql(["run", "--", "true"], ql_env).returncode == 0
    probe = ("import gc, sys\n"
             "import ql_core.follow as follow\n"
             "real = follow.follow_log\n"
             "def spy(*a, **k):\n"
             "    sys.stderr.write(f'GC_AT_FOLLOW={gc.isenabled()}\\n')\n"
             "    return real(*a, **k)\n"
             "follow.follow_log = spy\n"
             "from ql_core.cli.main import console_main\n"
             "sys.argv = ['ql'] + sys.argv[1:]\n"
             "console_main()\n")
    out = subprocess.run([sys.executable, "-c", probe, "logs", "--follow", "last"], env=ql_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("GC_AT_")] == ["GC_AT_FOLLOW=True"]


def test_the_receipt_codec_loads_without_the_file_store() -> None:
    """Every launch encodes a receipt; only the receipt-store plugin opens the store. The package's
    file-store names stay importable from ``ql_core.receipts`` (loaded at first use)."""
    probe = ("import sys\n"
             "import ql_core.receipts.codec\n"
             "assert 'ql_core.receipts.file_store' not in sys.modules\n"
             "from ql_core.receipts import FileReceiptStore, ReadStatus\n"
             "from ql_core.receipts.file_store import FileReceiptStore as direct\n"
             "assert FileReceiptStore is direct and ReadStatus.__module__.startswith('ql_core.')\n"
             "import ql_core.receipts as package\n"
             "assert not hasattr(package, 'no_such_name')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_an_awaited_task_runs_no_import_statement(runtime) -> None:  # noqa: ANN001 - the conftest fixture
    """An embedded host's task path (submit, wait, completion) imports its modules once, at module level:
    a function-level ``from .x import y`` runs the import machinery on every call (a Python-level spec
    property and two formatted AttributeErrors for a plain module; ~11k instructions each under
    callgrind, 16 of them per task before)."""
    for _ in range(3):  # whatever a first task loads on demand is loaded
        assert runtime.run(["true"]).status == "succeeded"
    seen: list[str] = []

    def profile(frame, event, _arg):  # noqa: ANN001, ANN202 - sys.setprofile's hook
        if event == "call" and frame.f_code.co_filename.startswith("<frozen importlib"):
            seen.append(f"{frame.f_back.f_code.co_filename}:{frame.f_back.f_lineno}" if frame.f_back else "?")

    sys.setprofile(profile)
    try:
        for _ in range(3):
            runtime.run(["true"])
    finally:
        sys.setprofile(None)
    assert seen == []

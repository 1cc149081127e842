"""Issue 26 item 5: the embedding API's foot-guns are clear errors before anything is committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql_core.config import load_config
from ql_core.errors import RuntimeClosedError, UsageError
from ql_core.runtime import Runtime


@pytest.fixture
def rt(tmp_path: Path):
    with Runtime.open(load_config(data_dir=tmp_path / "d")) as runtime:
        yield runtime


def test_a_str_command_is_a_type_error_and_commits_no_run(rt: Runtime) -> None:
    with pytest.raises(TypeError, match=r"list of arguments, not a str.*\[\"sh\", \"-c\"") as info:
        rt.submit("echo hi")  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="list of str"):
        rt.submit(["echo", 1])  # type: ignore[list-item]
    assert rt.list_runs() == []


def test_env_values_must_be_str(rt: Runtime) -> None:
    with pytest.raises(TypeError, match=r"env must map str to str: a value is of type int; pass str\(value\)"):
        rt.submit(["true"], env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="env must map str to str: a key"):
        rt.submit(["true"], env={1: "x"})  # type: ignore[dict-item]
    assert rt.list_runs() == []
    assert rt.wait(rt.submit(["sh", "-c", 'test "$A" = 1'], env={"A": "1"})).status == "succeeded"


def test_api_errors_name_api_parameters_not_cli_flags(rt: Runtime) -> None:
    for bad in (-1, 0, 10**9):
        with pytest.raises(UsageError) as info:
            rt.submit(["true"], timeout_s=bad)
        assert str(info.value).startswith("timeout_s must be") and "--" not in str(info.value)
    with pytest.raises(TypeError, match="timeout_s must be a number"):
        rt.submit(["true"], timeout_s="5")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="shell=True: exactly one string"):
        rt.submit(["a", "b"], shell=True)
    assert rt.list_runs() == []


def test_submit_after_close_says_the_runtime_is_closed(tmp_path: Path) -> None:
    rt = Runtime.open(load_config(data_dir=tmp_path / "d"))
    rt.close()
    with pytest.raises(RuntimeClosedError, match="this runtime is closed"):
        rt.submit(["true"])
    with Runtime.open(load_config(data_dir=tmp_path / "d")) as again:
        assert again.list_runs() == []


def test_log_chunks_carry_bytes(rt: Runtime) -> None:
    from ql_core.follow import follow_log

    sub = rt.submit(["sh", "-c", "printf 'caf\\303\\251'"])
    rt.wait(sub)
    chunks = list(follow_log(rt, sub.run_id))
    assert all(isinstance(c.data, bytes) for c in chunks) and b"".join(c.data for c in chunks) == "café".encode()

"""``pycoll run``: environment of the ranks, failure propagation, signal forwarding, output tagging.

The launcher runs as a subprocess (it installs signal handlers and spawns ranks); every wait has a
deadline and the launcher always picks its store port with port 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pycoll.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]

# Child processes get this prelude; pycoll's API loads lazily, so pycoll.bootstrap imports without
# the native module.
IMPORT_SHIM = "import sys\n"

LAUNCHER = IMPORT_SHIM + "\nfrom pycoll.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
DEADLINE = 30.0


def env_with_path(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def start_launcher(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "run", *args],
        env=env or env_with_path(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_launcher(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    start = time.monotonic()
    proc = start_launcher(args, env)
    try:
        out, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=DEADLINE)
        pytest.fail(f"launcher did not finish within {DEADLINE} s\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err, time.monotonic() - start


def write_script(path: Path, body: str) -> str:
    path.write_text(IMPORT_SHIM + textwrap.dedent(body))
    return str(path)


def wait_for_files(paths: list[Path], timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < end, f"timed out waiting for {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.02)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_three_ranks_succeed(tmp_path):
    script = write_script(
        tmp_path / "child.py",
        f"""
        import json, os
        from pycoll.bootstrap.env import detect_launch, launcher_hosts_store
        from pycoll.bootstrap.rendezvous import rendezvous, store_barrier
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "PYCOLL_LAUNCHER_STORE"]
        info = detect_launch()
        store, server = rendezvous(info, timeout=20, store_hosted_externally=launcher_hosts_store())
        assert server is None  # the launcher hosts the store; rank 0 only connects
        total = store.add("ranks", info.rank + 1)
        store_barrier(store, "end", info.rank, info.world_size, timeout=20)
        record = {{k: os.environ[k] for k in keys}}
        record["sum"] = int(store.get("ranks"))
        record["argv"] = sys.argv[1:]
        with open(os.path.join({str(tmp_path)!r}, f"env{{info.rank}}.json"), "w") as f:
            json.dump(record, f)
        store.close()
        """,
    )
    rc, out, err, _ = run_launcher(["-n", "3", script, "-n", "5", "--flag"])
    assert rc == 0, err
    records = [json.loads((tmp_path / f"env{r}.json").read_text()) for r in range(3)]
    assert [r["RANK"] for r in records] == ["0", "1", "2"]
    assert [r["LOCAL_RANK"] for r in records] == ["0", "1", "2"]
    assert {r["WORLD_SIZE"] for r in records} == {"3"}
    assert {r["LOCAL_WORLD_SIZE"] for r in records} == {"3"}
    assert {r["MASTER_ADDR"] for r in records} == {"127.0.0.1"}
    assert len({r["MASTER_PORT"] for r in records}) == 1 and int(records[0]["MASTER_PORT"]) > 0
    assert {r["PYCOLL_LAUNCHER_STORE"] for r in records} == {"1"}
    assert {r["sum"] for r in records} == {6}
    assert all(r["argv"] == ["-n", "5", "--flag"] for r in records)


FAILING_RANK = """
import os, signal, sys, time
d = {tmp!r}
rank = int(os.environ["RANK"])
{ignore_term}
if rank == 1:
    end = time.monotonic() + 20
    while not all(os.path.exists(os.path.join(d, f"pid{{r}}")) for r in (0, 2)):
        assert time.monotonic() < end
        time.sleep(0.01)
    sys.exit(3)
with open(os.path.join(d, f"pid{{rank}}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(d, f"pid{{rank}}.tmp"), os.path.join(d, f"pid{{rank}}"))
end = time.monotonic() + 60
while time.monotonic() < end:
    time.sleep(0.05)
"""


def test_failing_rank_stops_the_others(tmp_path):
    script = write_script(tmp_path / "fail.py", FAILING_RANK.format(tmp=str(tmp_path), ignore_term=""))
    rc, _, err, elapsed = run_launcher(["-n", "3", script])
    assert rc == 3, err
    assert elapsed < 15, f"launcher took {elapsed:.1f} s"
    assert "rank 1" in err and "exit code 3" in err
    assert "rank 1 failed" in err
    for r in (0, 2):
        assert pid_gone(int((tmp_path / f"pid{r}").read_text())), f"rank {r} survived the launcher"


def test_rank_ignoring_sigterm_is_killed_after_grace(tmp_path):
    script = write_script(
        tmp_path / "stubborn.py",
        FAILING_RANK.format(tmp=str(tmp_path), ignore_term="signal.signal(signal.SIGTERM, signal.SIG_IGN)"),
    )
    rc, _, err, elapsed = run_launcher(["-n", "3", "--grace-period", "0.5", script])
    assert rc == 3, err
    assert elapsed < 15
    assert "SIGKILL" in err and "rank 1 failed" in err
    for r in (0, 2):
        assert pid_gone(int((tmp_path / f"pid{r}").read_text()))


def test_rank_killed_by_signal_is_reported(tmp_path):
    script = write_script(
        tmp_path / "die.py",
        """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """,
    )
    rc, _, err, elapsed = run_launcher(["-n", "2", script])
    assert rc == 128 + signal.SIGKILL, err
    assert elapsed < 15
    assert "rank 0" in err and "SIGKILL" in err


def test_sigterm_to_launcher_reaches_children(tmp_path):
    script = write_script(
        tmp_path / "term.py",
        f"""
        import os, signal, sys, time
        d = {str(tmp_path)!r}
        rank = os.environ["RANK"]

        def on_term(signum, frame):
            open(os.path.join(d, f"got-term{{rank}}"), "w").close()
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
        open(os.path.join(d, f"ready{{rank}}"), "w").close()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            time.sleep(0.05)
        """,
    )
    proc = start_launcher(["-n", "3", script])
    try:
        wait_for_files([tmp_path / f"ready{r}" for r in range(3)])
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert all((tmp_path / f"got-term{r}").exists() for r in range(3))
    assert "SIGTERM" in err


def test_tag_output(tmp_path):
    script = write_script(
        tmp_path / "talk.py",
        """
        import os
        print("hello", os.environ["RANK"])
        print("oops", os.environ["RANK"], file=sys.stderr)
        """,
    )
    rc, out, err, _ = run_launcher(["-n", "2", "--tag-output", script])
    assert rc == 0, err
    assert "[rank 0] hello 0" in out.splitlines() and "[rank 1] hello 1" in out.splitlines()
    assert "[rank 0] oops 0" in err.splitlines() and "[rank 1] oops 1" in err.splitlines()


def test_output_passes_through_untagged(tmp_path):
    # one write() per line: untagged ranks share the launcher's stdout, so only whole writes stay whole
    script = write_script(
        tmp_path / "plain.py", "import os; os.write(1, f\"plain {os.environ['RANK']}\\n\".encode())\n"
    )
    rc, out, err, _ = run_launcher(["-n", "2", script])
    assert rc == 0, err
    assert sorted(out.splitlines()) == ["plain 0", "plain 1"]


def test_module_mode(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            with open(os.path.join({str(tmp_path)!r}, "mod" + os.environ["RANK"]), "w") as f:
                json.dump(sys.argv[1:], f)
            """
        )
    )
    env = env_with_path()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    rc, _, err, _ = run_launcher(["-n", "2", "-m", "mypkg.job", "-n", "7", "x"], env=env)
    assert rc == 0, err
    for r in range(2):
        assert json.loads((tmp_path / f"mod{r}").read_text()) == ["-n", "7", "x"]


def test_usage_errors(tmp_path):
    rc, _, err, _ = run_launcher(["-n", "2", str(tmp_path / "missing.py")])
    assert rc == 2 and "script not found" in err
    rc, _, err, _ = run_launcher(["-n", "0", str(tmp_path / "missing.py")])
    assert rc == 2 and "-n" in err


def test_python_m_pycoll_run(tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import pycoll.cli.run"],
        env=env_with_path(),
        capture_output=True,
        timeout=DEADLINE,
    )
    if probe.returncode != 0:
        pytest.skip("the pycoll package does not import in this checkout (native module not built?)")
    script = tmp_path / "ok.py"
    script.write_text("import os; os.write(1, f\"rank {os.environ['RANK']}\\n\".encode())\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pycoll.run", "-n", "2", str(script)],
        env=env_with_path(), capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0", "rank 1"]


def test_cli_help_lists_run(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main.main(["--help"])
    assert info.value.code == 0
    assert "run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        cli_main.main(["run", "--help"])
    assert info.value.code == 0
    assert "--tag-output" in capsys.readouterr().out


SLEEPER = """
import os, time
d = {tmp!r}
with open(os.path.join(d, "pid" + os.environ["RANK"] + ".tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(d, "pid" + os.environ["RANK"] + ".tmp"), os.path.join(d, "pid" + os.environ["RANK"]))
try:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.05)
except KeyboardInterrupt:
    open(os.path.join(d, "int" + os.environ["RANK"]), "w").close()
    raise
"""


def test_sigint_to_launcher_interrupts_ranks(tmp_path):
    script = write_script(tmp_path / "sleeper.py", SLEEPER.format(tmp=str(tmp_path)))
    proc = start_launcher(["-n", "2", script])
    try:
        wait_for_files([tmp_path / f"pid{r}" for r in range(2)])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert all((tmp_path / f"int{r}").exists() for r in range(2))  # each rank saw one KeyboardInterrupt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_ranks_die_with_a_killed_launcher(tmp_path):
    script = write_script(tmp_path / "sleeper.py", SLEEPER.format(tmp=str(tmp_path)))
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "run", "-n", "2", script],
        env=env_with_path(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        wait_for_files([tmp_path / f"pid{r}" for r in range(2)])
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        proc.kill()
        proc.wait(timeout=DEADLINE)
        end = time.monotonic() + 10
        # the ranks are re-parented (to init or a subreaper), which reaps them once they die
        while not all(pid_gone(p) or _is_zombie(p) for p in pids):
            assert time.monotonic() < end, "ranks outlived their killed launcher"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=DEADLINE)
        for pid in pids:
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# --------------------------------------------------------------------------------------------------
# Several nodes: pycoll run --nnodes M --node-rank K --master-addr A --master-port P


def test_parse_nnodes():
    from pycoll.cli.run import build_parser

    args = build_parser().parse_args(
        ["-n", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0", "--master-port", "29500",
         "train.py", "--lr", "1", "--nnodes", "9"]
    )  # fmt: skip
    assert (args.nproc, args.nnodes, args.node_rank) == (4, 2, 1)
    assert (args.master_addr, args.master_port) == ("node0", 29500)
    assert args.program == "train.py" and args.args == ["--lr", "1", "--nnodes", "9"]  # the script's own
    args = build_parser().parse_args(["--nproc-per-node", "2", "s.py"])
    assert (args.nproc, args.nnodes, args.node_rank, args.master_addr, args.master_port) == (2, 1, 0, None, 0)


def test_rank_env_of_nodes():
    from pycoll.cli.run import _rank_env

    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "PYCOLL_LAUNCHER_STORE")  # fmt: skip
    # one node, as `-n 3` has always started ranks
    env = _rank_env({"KEEP": "1", "RANK": "99"}, 2, 3, 4000, False)
    assert [env[k] for k in keys] == ["2", "3", "2", "3", "0", "1", "0", "127.0.0.1", "4000", "1"]
    assert env["KEEP"] == "1"
    # node 2 of 3 with 4 ranks each: ranks 8..11
    for local in range(4):
        env = _rank_env({}, local, 4, 29500, False, nnodes=3, node_rank=2, master_addr="10.0.0.1")
        expected = [str(8 + local), "12", str(local), "4", "2", "3", "2", "10.0.0.1", "29500", "1"]
        assert [env[k] for k in keys] == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nnodes", "2"], ["--nnodes 2 needs --master-addr and --master-port", "same --master-addr"]),
        (["--nnodes", "2", "--master-addr", "node0"], ["needs --master-port", "node 0's launcher hosts"]),
        (["--nnodes", "2", "--master-port", "29500"], ["needs --master-addr"]),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--master-port", "5"],
         ["--node-rank must be in 0..1", "got 2"]),
        (["--node-rank", "-1"], ["--node-rank must be in 0..0"]),
        (["--nnodes", "0"], ["--nnodes must be at least 1"]),
        (["--nnodes", "2", "--master-addr", " ", "--master-port", "5"], ["--master-addr"]),
    ],
)  # fmt: skip
def test_nnodes_usage_errors(tmp_path, capsys, argv, expected):
    from pycoll.cli.run import build_parser, run_command

    script = tmp_path / "never_run.py"
    script.write_text("raise SystemExit(5)\n")
    assert run_command(build_parser().parse_args(["-n", "2", *argv, str(script)])) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err


def test_socket_ifname_that_does_not_exist(capsys):
    from pycoll.cli.run import launch

    env = env_with_path({"PYCOLL_SOCKET_IFNAME": "nosuchif0"})
    cmd = [sys.executable, "-c", "raise SystemExit(5)"]
    rc = launch(2, cmd, master_port=free_port(), master_addr="127.0.0.1", nnodes=2, node_rank=0, env=env)
    assert rc == 2
    err = capsys.readouterr().err
    assert "PYCOLL_SOCKET_IFNAME='nosuchif0'" in err and "no such network interface" in err


def free_port() -> int:
    """A port free now. Another process may take it before the launcher binds it: start_two_nodes
    then tries another one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def start_node(
    tmp_path: Path, node: int, port: int, args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """One `pycoll run --nnodes 2 --node-rank node` on this machine, output to files."""
    out, err = tmp_path / f"node{node}-{port}.out", tmp_path / f"node{node}-{port}.err"
    cmd = [sys.executable, "-c", LAUNCHER, "run", "--nnodes", "2", "--node-rank", str(node),
           "--master-addr", "127.0.0.1", "--master-port", str(port), *args]  # fmt: skip
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, env=env or env_with_path(), stdout=fo, stderr=fe)
    return proc, out, err


def start_two_nodes(
    tmp_path: Path, args: list[str], env: dict[str, str] | None = None
) -> list[tuple[subprocess.Popen[bytes], Path, Path]]:
    """Node 0 first, on a free port: once it says it listens, node 1. Should the port have been taken
    between free_port() and the launcher's bind (the launcher then exits 2), another one is tried."""
    for _ in range(5):
        port = free_port()
        node0 = start_node(tmp_path, 0, port, args, env)
        end = time.monotonic() + DEADLINE
        while "listening on" not in _read(node0[2]) and node0[0].poll() is None:
            if time.monotonic() > end:
                node0[0].kill()
                node0[0].wait(timeout=DEADLINE)
                pytest.fail(f"node 0's launcher did not start listening:\n{_read(node0[2])}")
            time.sleep(0.02)
        if node0[0].poll() == 2 and "cannot listen" in _read(node0[2]):
            continue
        return [node0, start_node(tmp_path, 1, port, args, env)]
    pytest.fail("no free port could be bound in 5 tries")


def finish(nodes: list[tuple[subprocess.Popen[bytes], Path, Path]]) -> list[tuple[int, str, str]]:
    """Wait for every launcher (killing them past the deadline); (exit code, stdout, stderr) of each."""
    end = time.monotonic() + DEADLINE
    try:
        for proc, _, err in nodes:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"launcher did not finish within {DEADLINE} s:\n{_read(err)}")
    finally:
        for proc, _, _ in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=DEADLINE)
    return [(proc.returncode, _read(out), _read(err)) for proc, out, err in nodes]


def test_two_nodes_share_node0s_store(tmp_path):
    script = write_script(
        tmp_path / "node_child.py",
        f"""
        import json, os
        from pycoll.bootstrap.env import detect_launch, launcher_hosts_store
        from pycoll.bootstrap.rendezvous import rendezvous, store_barrier
        info = detect_launch()
        store, server = rendezvous(info, timeout=20, store_hosted_externally=launcher_hosts_store())
        assert server is None  # no rank hosts a store: node 0's launcher does
        store.add("ranks", info.rank + 1)
        store_barrier(store, "end", info.rank, info.world_size, timeout=20)
        record = {{k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK",
                                             "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")}}
        record["sum"] = int(store.get("ranks"))
        record["node"] = [info.node_rank, info.num_nodes]
        with open(os.path.join({str(tmp_path)!r}, f"rank{{info.rank}}.json"), "w") as f:
            json.dump(record, f)
        store.close()
        """,
    )
    results = finish(start_two_nodes(tmp_path, ["-n", "2", "--tag-output", script]))
    for rc, _, err in results:
        assert rc == 0, err
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [(r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"], r["NODE_RANK"]) for r in records] == [
        ("0", "0", "0", "0"), ("1", "1", "0", "0"), ("2", "0", "1", "1"), ("3", "1", "1", "1"),
    ]  # fmt: skip
    assert {(r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]) for r in records} == {("4", "2")}
    assert len({r["MASTER_PORT"] for r in records}) == 1
    assert {r["sum"] for r in records} == {10}
    assert [r["node"] for r in records] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert "(node 0 of 2): rendezvous store listening on 0.0.0.0:" in results[0][2]
    assert "listening" not in results[1][2]  # node 1 hosts nothing


def test_node_without_node0_names_the_address(tmp_path):
    script = write_script(
        tmp_path / "lonely.py",
        """
        from pycoll.bootstrap.env import detect_launch, launcher_hosts_store
        from pycoll.bootstrap.rendezvous import rendezvous
        rendezvous(detect_launch(), timeout=1.5, store_hosted_externally=launcher_hosts_store())
        """,
    )
    port = free_port()  # nothing listens there
    ((rc, _, err),) = finish([start_node(tmp_path, 1, port, ["-n", "2", script])])
    assert rc == 1, err
    assert f"127.0.0.1:{port}" in err and "node 0's launcher did not answer" in err
    assert "(node 1 of 2)" in err and ("rank 2" in err or "rank 3" in err)


def test_socket_ifname_binds_that_interface(tmp_path):
    if "lo" not in [name for _, name in socket.if_nameindex()]:
        pytest.skip("no 'lo' interface")
    script = write_script(tmp_path / "quick.py", "pass\n")
    env = env_with_path({"PYCOLL_SOCKET_IFNAME": "lo"})
    for _ in range(5):  # another process may take the free port first: then the launcher exits 2
        port = free_port()
        rc, _, err, _ = run_launcher(
            ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port), "-n", "1", script],
            env,
        )
        if not (rc == 2 and "cannot listen" in err):
            break
    assert rc == 0, err
    assert f"rendezvous store listening on 127.0.0.1:{port}" in err

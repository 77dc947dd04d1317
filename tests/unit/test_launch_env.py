"""Launch environments across nodes: torchrun, ``pycoll run --nnodes``, Open MPI and Slurm fixtures
(2 nodes x 4 ranks, uneven Slurm layouts), Slurm hostlists, bad values, and the PYCOLL_HOST_ID /
PYCOLL_SOCKET_IFNAME settings. No processes: every case is a dictionary of variables."""

from __future__ import annotations

import socket
import sys

import pytest

from pycoll.bootstrap.env import LaunchInfo, detect_launch, explicit_launch, slurm_first_host
from pycoll.bootstrap.net import interface_address, listen_address
from pycoll.cli.run import _rank_env
from pycoll.env import Settings
from pycoll.errors import InvalidUsageError

NODES, PER_NODE = 2, 4
WORLD = NODES * PER_NODE


def torchrun_env(rank: int) -> dict[str, str]:
    """What torchrun --nnodes 2 --nproc-per-node 4 gives rank ``rank`` (its own set, not all of it)."""
    return {
        "RANK": str(rank), "WORLD_SIZE": str(WORLD),
        "LOCAL_RANK": str(rank % PER_NODE), "LOCAL_WORLD_SIZE": str(PER_NODE),
        "GROUP_RANK": str(rank // PER_NODE), "GROUP_WORLD_SIZE": str(NODES),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(WORLD), "ROLE_NAME": "default",
        "MASTER_ADDR": "node0.cluster", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job7",
    }  # fmt: skip


def openmpi_env(rank: int) -> dict[str, str]:
    """mpirun -n 8 --map-by ppr:4:node on 2 nodes. NODE_RANK is Open MPI's rank on the node across
    all jobs, which for one job equals the local rank: not a node index."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(WORLD),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % PER_NODE), "OMPI_COMM_WORLD_LOCAL_SIZE": str(PER_NODE),
        "OMPI_COMM_WORLD_NODE_RANK": str(rank % PER_NODE), "OMPI_MCA_ess_base_jobid": "777",
        "MASTER_ADDR": "10.1.0.1", "MASTER_PORT": "29501",
    }  # fmt: skip


def slurm_env(
    rank: int, node: int, local: int, tasks_per_node: str, ntasks: int, nodes: int
) -> dict[str, str]:
    return {
        "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
        "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_JOB_NUM_NODES": "6",
        "SLURM_STEP_NODELIST": "gpu-node[07-08]", "SLURM_JOB_NODELIST": "gpu-node[03,07-10,12]",
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "MASTER_PORT": "29502",
    }  # fmt: skip


# --------------------------------------------------------------------------------------------------
# 2 nodes x 4 ranks under each launcher


@pytest.mark.parametrize("rank", range(WORLD))
def test_torchrun_two_nodes(rank):
    info = detect_launch(torchrun_env(rank))
    assert info == LaunchInfo(
        rank, WORLD, rank % PER_NODE, PER_NODE, "node0.cluster", 29500, "torchrun", "job7",
        node_rank=rank // PER_NODE, num_nodes=NODES,
    )  # fmt: skip
    assert not info.single_host


@pytest.mark.parametrize("rank", range(WORLD))
def test_pycoll_run_nnodes_env_is_read_back(rank):
    node, local = divmod(rank, PER_NODE)
    env = _rank_env({}, local, PER_NODE, 29600, False, nnodes=NODES, node_rank=node, master_addr="10.0.0.9")
    info = detect_launch(env)
    assert info is not None
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert layout == (rank, WORLD, local, PER_NODE)
    assert (info.node_rank, info.num_nodes) == (node, NODES)
    assert (info.master_addr, info.master_port, info.launcher) == ("10.0.0.9", 29600, "torchrun")
    assert env["NODE_RANK"] == env["GROUP_RANK"] == str(node) and env["PYCOLL_LAUNCHER_STORE"] == "1"


@pytest.mark.parametrize("rank", range(WORLD))
def test_openmpi_two_nodes(rank):
    info = detect_launch(openmpi_env(rank))
    assert info == LaunchInfo(rank, WORLD, rank % PER_NODE, PER_NODE, "10.1.0.1", 29501, "openmpi", "777")
    # OMPI_COMM_WORLD_NODE_RANK is not a node index, so Open MPI gives none (the communicator finds it)
    assert info.node_rank is None and info.num_nodes is None
    assert not info.single_host


@pytest.mark.parametrize("rank", range(WORLD))
def test_slurm_two_nodes(rank):
    node, local = divmod(rank, PER_NODE)
    info = detect_launch(slurm_env(rank, node, local, "4(x2)", WORLD, NODES))
    assert info == LaunchInfo(
        rank, WORLD, local, PER_NODE, "gpu-node07", 29502, "slurm", "4242.1", node_rank=node, num_nodes=NODES
    )


# Uneven: 3 tasks on the first node, 2 on each of the next two (srun -n 7 -N 3, block distribution).
UNEVEN = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1)]  # (node, local) of ranks 0..6
UNEVEN_COUNTS = [3, 2, 2]


@pytest.mark.parametrize("rank", range(len(UNEVEN)))
def test_slurm_uneven_layout(rank):
    node, local = UNEVEN[rank]
    env = slurm_env(rank, node, local, "3,2(x2)", 7, 3)
    env["SLURM_STEP_NODELIST"] = "cpu[1-3]"
    info = detect_launch(env)
    assert info is not None
    assert (info.local_rank, info.local_world_size) == (local, UNEVEN_COUNTS[node])
    assert (info.node_rank, info.num_nodes, info.master_addr) == (node, 3, "cpu1")
    # srun always sets SLURM_LOCALID; without it the local rank follows the block distribution
    del env["SLURM_LOCALID"]
    info = detect_launch(env)
    assert info is not None and info.local_rank == local
    # the node count from SLURM_STEP_TASKS_PER_NODE alone
    del env["SLURM_STEP_NUM_NODES"]
    info = detect_launch(env)
    assert info is not None and info.num_nodes == 3


def test_slurm_master_addr():
    env = slurm_env(5, 1, 1, "4(x2)", 8, 2)
    del env["SLURM_STEP_NODELIST"]
    info = detect_launch(env)
    assert info is not None and info.master_addr == "gpu-node03"  # the job's first host, without the step's
    env["MASTER_ADDR"] = "head"
    info = detect_launch(env)
    assert info is not None and info.master_addr == "head"  # MASTER_ADDR, when set, wins
    # One node: the ranks meet on loopback whatever the node list says.
    one = slurm_env(1, 0, 1, "4", 4, 1)
    info = detect_launch(one)
    assert info is not None and info.master_addr == "127.0.0.1" and info.single_host
    assert (info.node_rank, info.num_nodes) == (0, 1)


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("gpu-node[07-10,12],cpu1", "gpu-node07"),
        ("cpu1,gpu-node[07-10]", "cpu1"),
        ("node01", "node01"),
        ("n[003,001-002]", "n003"),
        ("rack[2-3]-n[5-6]", "rack2-n5"),
        ("x[1-2]y,z", "x1y"),
        (" a[9] ", "a9"),
        ("10.0.0.[5-6]", "10.0.0.5"),
    ],
)
def test_slurm_first_host(nodelist, first):
    assert slurm_first_host(nodelist) == first


@pytest.mark.parametrize("nodelist", ["gpu[1-2", "gpu]1", "gpu[a-b]", "gpu[]", ",a", "", "gpu 1,x"])
def test_slurm_first_host_errors(nodelist):
    with pytest.raises(InvalidUsageError, match="SLURM_STEP_NODELIST") as info:
        slurm_first_host(nodelist, "SLURM_STEP_NODELIST")
    assert "hostlist" in str(info.value)


def _torch(**extra: str) -> dict[str, str]:
    env = {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}
    env.update(extra)
    return env


def _slurm(**extra: str) -> dict[str, str]:
    env = slurm_env(5, 1, 1, "4(x2)", 8, 2)
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("env", "names"),
    [
        (_torch(GROUP_RANK="2", GROUP_WORLD_SIZE="2"), ["GROUP_RANK=2", "GROUP_WORLD_SIZE=2"]),
        (_torch(GROUP_RANK="x"), ["GROUP_RANK", "'x'"]),
        (_torch(GROUP_WORLD_SIZE="0"), ["GROUP_WORLD_SIZE", ">= 1"]),
        (_torch(GROUP_WORLD_SIZE="9"), ["GROUP_WORLD_SIZE=9", "world size (8)"]),
        (_torch(GROUP_WORLD_SIZE="6"), ["GROUP_WORLD_SIZE=6", "4 ranks on this node"]),
        (_torch(NODE_RANK="8"), ["NODE_RANK=8", "world size 8"]),
        (_slurm(SLURM_STEP_TASKS_PER_NODE="4,3"), ["SLURM_STEP_TASKS_PER_NODE='4,3'", "7", "SLURM_NTASKS=8"]),
        (_slurm(SLURM_STEP_NUM_NODES="3"), ["SLURM_STEP_NUM_NODES=3", "'4(x2)'", "2 nodes"]),
        (_slurm(SLURM_NODEID="2"), ["SLURM_NODEID=2"]),
        (_slurm(SLURM_NODEID="-1"), ["SLURM_NODEID", "-1"]),
        (_slurm(SLURM_STEP_TASKS_PER_NODE="8", SLURM_STEP_NUM_NODES="1", SLURM_NODEID="1", SLURM_LOCALID="5"),
         ["SLURM_NODEID=1"]),
        (_slurm(SLURM_STEP_TASKS_PER_NODE="4(x)"), ["SLURM_STEP_TASKS_PER_NODE", "4(x)"]),
        (_slurm(SLURM_LOCALID="4"), ["SLURM_LOCALID=4", "SLURM_STEP_TASKS_PER_NODE"]),
        (_slurm(SLURM_STEP_NODELIST="gpu[07-"), ["SLURM_STEP_NODELIST", "gpu[07-"]),
    ],
)  # fmt: skip
def test_bad_multi_node_values_name_the_variable(env, names):
    with pytest.raises(InvalidUsageError) as info:
        detect_launch(env)
    for name in names:
        assert name in str(info.value)


def test_launch_info_node_checks():
    assert explicit_launch(5, 8, local_rank=1, local_world_size=4, node_rank=1, num_nodes=2).node_rank == 1
    for kwargs in ({"node_rank": 2, "num_nodes": 2}, {"num_nodes": 9}, {"num_nodes": 6}, {"node_rank": -1}):
        with pytest.raises(InvalidUsageError, match="node"):
            explicit_launch(5, 8, local_rank=1, local_world_size=4, **kwargs)


# --------------------------------------------------------------------------------------------------
# PYCOLL_HOST_ID and PYCOLL_SOCKET_IFNAME


def test_host_id_and_ifname_settings():
    settings = Settings.from_environ({"PYCOLL_HOST_ID": " rack3-node7 ", "PYCOLL_SOCKET_IFNAME": "eth0"})
    assert (settings.host_id, settings.socket_ifname) == ("rack3-node7", "eth0")
    assert (Settings.from_environ({}).host_id, Settings.from_environ({}).socket_ifname) == (None, None)
    assert Settings.from_environ({"PYCOLL_HOST_ID": "  ", "PYCOLL_SOCKET_IFNAME": ""}).host_id is None
    with pytest.raises(InvalidUsageError, match="PYCOLL_HOST_ID"):
        Settings.from_environ({"PYCOLL_HOST_ID": "a\x00b"})
    with pytest.raises(InvalidUsageError, match="PYCOLL_HOST_ID"):
        Settings.from_environ({"PYCOLL_HOST_ID": "x" * 300})
    for bad in ("^docker,lo", "eth0,eth1", "=eth0", "averyveryverylongname0"):
        with pytest.raises(InvalidUsageError, match="PYCOLL_SOCKET_IFNAME"):
            Settings.from_environ({"PYCOLL_SOCKET_IFNAME": bad})


def _has_loopback_interface() -> bool:
    try:
        return "lo" in [name for _, name in socket.if_nameindex()]
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_loopback_interface(), reason="needs lo")
def test_interface_address():
    assert interface_address("lo") == "127.0.0.1"
    assert listen_address("node0", "lo") == "127.0.0.1"
    assert listen_address("node0", None) == "0.0.0.0"
    assert listen_address("fd00::1", None) == "::"
    with pytest.raises(InvalidUsageError) as info:
        interface_address("nosuchif0")
    assert "nosuchif0" in str(info.value) and "lo" in str(info.value)  # names the interfaces there are

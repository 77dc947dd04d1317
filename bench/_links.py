"""Driver side of the training benchmarks over emulated hosts (bench/fsdp_links.py, bench/time_to_loss.py):
starting one job of rank processes on this host or on network-namespace hosts, following what rank 0
writes, and removing everything afterwards.

    ok = run_netns(2, 2, program, out, rate="1gbit", timeout=600, verbose=False, work=tmp)  # 2 hosts x 2
    ok = run_local(4, program, out, timeout=600, verbose=False, work=tmp)      # 4 ranks on this host
    records = read_records(out)

``program`` is the rank processes' command line (a script with its ``--worker`` arguments); every
launch is ``pycoll run`` (one launcher per virtual host: tests/netns.py) and ends within ``timeout``:
the launchers and every process they started are killed then. Rank 0 appends JSON lines to ``out``:
``{"progress": turn, "turns": n, "ms": {variant: ms}}`` (printed as they come: ``progress_writer``),
its results, and a last ``{"done": true}``. The command-line flags of the training itself (model, steps,
turns, held-out set) are ``add_training_arguments``'s, read back by ``train_settings``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _netns() -> Any:
    """tests/netns.py (the virtual hosts), imported from the checkout."""
    if str(REPO / "tests") not in sys.path:
        sys.path.append(str(REPO / "tests"))
    import netns

    return netns


def why_no_netns(rate: str | None) -> str | None:
    """Why the namespaces (and links shaped to ``rate``) cannot be made here, or None."""
    return _netns().why_no_netns(rate)


def split_list(text: str) -> list[str]:
    """The non-empty, stripped items of a comma list."""
    return [item.strip() for item in text.split(",") if item.strip()]


def rate_bps(rate: str | None) -> float:
    """tc's rate syntax in bits per second (``1gbit`` -> 1e9; None: 1 Gbit/s). ValueError if not a rate."""
    return float(_netns().rate_bits_per_s(rate or "1gbit"))


# ---------------------------------------------------------------------------------------------------------
# The training's command line


def add_training_arguments(p: argparse.ArgumentParser, eval_every: int) -> None:
    """The flags of the training (every variant the same): turns, steps, model, data, held-out set."""
    add = p.add_argument
    add("--turns", type=int, default=10, help="turns the variants take, order rotated per turn (10)")
    add("--steps", type=int, default=500, help="training steps per variant (500)")
    add("--local-steps", type=int, default=40, help="steps of the no-communication floor (40)")
    add("--timing-warmup", type=int, default=10, help="steps left out of the step times (10)")
    add("--last-k", type=int, default=20, help="steps whose mean loss is the final training loss (20)")
    add("--batch", type=int, default=2, help="sequences per rank per step (2)")
    add("--context", type=int, default=64, help="bytes per sequence (64)")
    add("--width", type=int, default=256, help="model width (256)")
    add("--depth", type=int, default=4, help="transformer blocks (4)")
    add("--heads", type=int, default=4, help="attention heads (4)")
    add("--lr", type=float, default=2e-3, help="AdamW peak learning rate (2e-3)")
    add("--seeds", default="0", help="weights and data seeds, a comma list: one job each (0)")
    add("--eval-batches", type=int, default=32, help="held-out batches of --eval-rows sequences (32)")
    add("--eval-rows", type=int, default=16, help="sequences per held-out batch (16)")
    add(
        "--eval-every",
        type=int,
        default=eval_every,
        help=f"a held-out point every N steps, 0: at the end only ({eval_every})",
    )


def apply_quick_training(args: argparse.Namespace) -> None:
    """--quick's training: a tiny model (width 64, 2 blocks, context 32), 30 steps in 3 turns."""
    args.steps, args.local_steps, args.timing_warmup, args.last_k, args.turns = 30, 15, 5, 5, 3
    args.width, args.depth, args.heads, args.context = 64, 2, 2, 32
    args.eval_batches, args.eval_rows, args.eval_every = 8, 8, 10


def train_settings(args: argparse.Namespace, seed: int, probe_iters: int, timeout_s: float) -> dict[str, Any]:
    """``_fsdp_train.TrainConfig.from_dict``'s input from ``add_training_arguments``'s flags."""
    model = {"width": args.width, "depth": args.depth, "heads": args.heads, "context": args.context}
    return {
        "model": model, "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "lr_warmup": max(1, args.steps // 20), "seed": seed, "timing_warmup": args.timing_warmup,
        "last_k": args.last_k, "eval_batches": args.eval_batches, "eval_rows": args.eval_rows,
        "eval_every": args.eval_every, "local_steps": args.local_steps, "probe_iters": probe_iters,
        "timeout_s": timeout_s,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Records


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """One JSON line appended to ``path``."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def progress_writer(out: str, turns: int, rank: int) -> Callable[[int, list[Any]], None]:
    """A ``train_interleaved`` progress callback: rank 0 appends a line per turn with the median of each
    run's step times in that turn (its own times: a progress line, not a result)."""

    def progress(turn: int, runs: list[Any]) -> None:
        if rank != 0:
            return
        last = {r.variant.name: r.times[r.turns[-1][0] : r.turns[-1][1]] for r in runs}
        ms = {n: 1e3 * statistics.median(t) for n, t in last.items() if t}
        append_record(out, {"progress": turn + 1, "turns": turns, "ms": ms})

    return progress


# ---------------------------------------------------------------------------------------------------------
# Launching


def watch(out: Path, running: Callable[[], bool], timeout: float) -> bool:
    """Prints each progress line as rank 0 writes it until the job ends; False when ``timeout`` ran out."""
    deadline, shown = time.monotonic() + timeout, 0
    while True:
        alive = running()
        records = read_records(out)
        for r in records[shown:]:
            if "progress" in r:
                ms = ", ".join(f"{n} {t:.0f}" for n, t in r["ms"].items())
                print(f"  turn {r['progress']}/{r['turns']}, ms/step (rank 0): {ms}", flush=True)
        shown = len(records)
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(2.0)


def run_job(
    h: int, ranks: int, program: list[str], out: Path, *, rate: str | None, timeout: float, verbose: bool,
    work: Path,
) -> bool:  # fmt: skip
    """``ranks`` rank processes running ``program``: on this host without namespaces when ``rate`` is None
    (``run_local``), else on ``h`` virtual hosts with links shaped to ``rate`` (``run_netns``)."""
    if rate is None:
        return run_local(ranks, program, out, timeout=timeout, verbose=verbose, work=work)
    return run_netns(h, ranks // h, program, out, rate=rate, timeout=timeout, verbose=verbose, work=work)


def run_netns(
    h: int, per_host: int, program: list[str], out: Path, *, rate: str | None, timeout: float, verbose: bool,
    work: Path,
) -> bool:  # fmt: skip
    """The job on ``h`` virtual hosts of ``per_host`` ranks each, links shaped to ``rate``; True when every
    launcher exited in time. Their output goes to stderr when ``verbose``, on a time-out or a failure."""
    netns = _netns()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYCOLL_TRANSPORT", None)
    with netns.virtual_hosts(h, rate) as hosts:
        nodes = netns.start_pycoll_job(hosts, per_host, program, work, env=env, tag=f"h{h}-")
        try:
            running = lambda: any(n.proc.poll() is None for n in nodes)  # noqa: E731
            ok = watch(out, running, timeout)
        finally:
            netns.stop_job(nodes)
        if verbose or not ok or any(n.proc.returncode for n in nodes):
            for n in nodes:
                print(
                    f"--- node {n.node_rank}: exit {n.proc.returncode}\n{n.stdout()}{n.stderr()}",
                    file=sys.stderr,
                )
    return ok


def run_local(
    ranks: int, program: list[str], out: Path, *, timeout: float, verbose: bool, work: Path
) -> bool:
    """The job on this host (``pycoll run -n ranks``, shared memory; gloo on loopback)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log_path = work / f"local-{out.stem}.log"
    cmd = [sys.executable, "-m", "pycoll.run", "-n", str(ranks), *program]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, env=env, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            ok = watch(out, lambda: proc.poll() is None, timeout)
        finally:
            stop_session(proc)
    if verbose or not ok or proc.returncode:
        print(f"--- exit {proc.returncode}\n{log_path.read_text(errors='replace')}", file=sys.stderr)
    return ok


def stop_session(proc: subprocess.Popen) -> None:
    """Ends the launcher started in a session of its own and every process of that session (its ranks):
    SIGTERM (the launcher forwards it), then SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None and sig == signal.SIGTERM:
            sig = signal.SIGKILL  # the launcher is gone; only stray ranks could be left
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (where nothing else handles them), so that the
    clean-up of the namespaces and processes runs."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, interrupt)

"""Training over several nodes (``train.nodes=N``): one launcher per node, the standard rendezvous.

Every node of a job runs the same ``run.py`` command (Slurm: ``hydra.launcher.nodes=N``, one task per node). Node 0
does the whole run: the row, the data cache, the job spec, ``torchrun`` with its share of the ranks, the gathered
weights, the evaluation. Every other node is a *follower*: its ``run.py`` starts ``torchrun`` with the same
rendezvous and its own node rank over ``scripts/train_distributed.py --join``, whose ranks receive the job spec from
rank 0 (``broadcast_spec``), train their slices, and end; the follower writes no row and runs no evaluation
(``follow``). Ranks are numbered node by node (node k holds ranks k x R .. k x R + R - 1, R = world_size / nodes),
so a run's batches, checkpoints and weights are those of one launcher with the same world size (the two-node test
in ``tests/test_multinode.py`` compares them bit for bit).

The rendezvous is torchrun's static one, read from the environment every launcher on a cluster provides:
``MASTER_ADDR`` / ``MASTER_PORT`` (the Slurm launcher's setup exports both: the job's first host, a port per array
task) and the node's rank, ``NODE_RANK`` or else Slurm's ``SLURM_NODEID``. A follower waits for node 0 up to
``JOIN_TIMEOUT_S`` or ``HARNESS_JOIN_TIMEOUT_S`` (node 0 composes, builds the data and the model before its
torchrun starts).

Shared storage: the run directory (the spec, the stop file, the final weights), ``paths.ckpt_dir`` (each rank writes
its ZeRO partitions there) and the data cache must be the same paths on every node, as the Slurm launcher's run
directory and ``$HARNESS_CKPT_DIR`` / ``$SCRATCH`` are on a cluster.

Evaluation stays on node 0 (its data-parallel ranks are node 0's GPUs, ``harness.eval_distributed``); the followers
end with the training. It is not a small part: ``make plan`` gives the paper sweep 2,546 GPU-hours of evaluation
against 2,218 of training. The harness spreads an evaluation over nodes another way: sharded evaluation
(``harness.shards``, ``+shard=<entry@length,...>``) runs its parts as separate one-node jobs that merge into the one
row, after a ``+shard=train`` job that may itself span nodes. Joining the followers into node 0's evaluation would
need every evaluator's plan cut across nodes and is not built.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from harness.config import ConfigError

JOIN_TIMEOUT_S = 3600  # the nodes' torchruns wait this long for one another (static rendezvous "timeout")
STEP_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")


@dataclass(frozen=True)
class Node:
    """This launcher's place in a job: ``rank`` of ``count`` nodes, each starting ``per_node`` ranks, meeting at
    ``addr:port`` (``count == 1``: ``torchrun --standalone``, no address)."""
    rank: int = 0
    count: int = 1
    per_node: int = 1
    addr: str = ""
    port: int = 0

    def torchrun_args(self) -> list[str]:
        if self.count == 1:
            return ["--standalone", f"--nproc_per_node={self.per_node}"]
        return [f"--nnodes={self.count}", f"--node_rank={self.rank}", f"--nproc_per_node={self.per_node}",
                f"--master_addr={self.addr}", f"--master_port={self.port}", "--rdzv_backend=static",
                f"--rdzv_conf=timeout={join_timeout_s()}"]

    @property
    def follower(self) -> bool:
        return self.rank > 0


def join_timeout_s(env=None) -> int:
    """``HARNESS_JOIN_TIMEOUT_S`` (seconds), else ``JOIN_TIMEOUT_S``."""
    env = os.environ if env is None else env
    return _int_env(env, "HARNESS_JOIN_TIMEOUT_S") or JOIN_TIMEOUT_S


def step_nodes(env=None) -> int | None:
    """Nodes of this Slurm step (srun's; outside srun, the job's); None outside Slurm."""
    env = os.environ if env is None else env
    n = next((env[k] for k in STEP_NODES if env.get(k)), None)
    try:
        return int(n) if n is not None else None
    except ValueError:
        return None


def _int_env(env, key: str) -> int | None:
    raw = env.get(key)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None
    return value


def node(world_size: int, nodes: int = 1, env=None) -> Node:
    """This launcher's ``Node`` for ``train.world_size`` ranks over ``train.nodes`` nodes. Refused in one line: a
    Slurm step whose node count is not ``train.nodes`` (every node would train its own copy, or one node would wait
    for ranks that never come), a missing or malformed rendezvous, a node rank outside ``0 .. nodes - 1``."""
    env = os.environ if env is None else env
    here = step_nodes(env)
    if here is not None and here != nodes:
        raise ConfigError(f"this Slurm step spans {here} nodes but train.nodes={nodes}: set train.nodes={here} "
                          f"(and train.world_size to all their GPUs), or submit with hydra.launcher.nodes={nodes}")
    per = world_size // nodes
    if nodes == 1:
        return Node(per_node=per)
    rank = _int_env(env, "NODE_RANK")
    rank = _int_env(env, "SLURM_NODEID") if rank is None else rank
    addr, port = env.get("MASTER_ADDR", ""), _int_env(env, "MASTER_PORT")
    if rank is None or not addr or port is None:
        missing = [k for k, v in (("NODE_RANK (or SLURM_NODEID)", rank), ("MASTER_ADDR", addr or None),
                                  ("MASTER_PORT", port)) if v is None]
        raise ConfigError(f"train.nodes={nodes}: the rendezvous needs {', '.join(missing)} in the environment "
                          f"(the Slurm launcher's setup exports them; by hand: the same MASTER_ADDR/MASTER_PORT on "
                          f"every node, NODE_RANK=0..{nodes - 1})")
    if not 0 <= rank < nodes:
        raise ConfigError(f"node rank {rank} is outside 0..{nodes - 1} (train.nodes={nodes})")
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT={port} is not a port")
    return Node(rank, nodes, per, addr, port)


def role(cfg, env=None) -> Node | None:
    """In ``run.py``, after composing: this node's ``Node`` when the run trains on several nodes (``None`` when it
    does not). A Slurm step of several nodes for a run that trains on one, or trains nothing, is refused in one line
    (each node would run the whole point and write its own row)."""
    t = cfg.get("train") or {}
    trains = bool(t.get("enabled")) and t.get("engine") == "deepspeed"
    nodes = int(t.get("nodes") or 1) if trains else 1
    if not trains and (step_nodes(env) or 1) > 1:
        raise ConfigError(f"this Slurm step spans {step_nodes(env)} nodes but the run trains nothing on them (a "
                          f"frozen point runs on one node): submit it with hydra.launcher.nodes=1")
    n = node(int(t.get("world_size") or 1), nodes, env)
    return n if n.count > 1 else None

"""Multi-process fine-tuning engine: DeepSpeed ZeRO (stage 3 by default) launched with torchrun. Its parts live in
``harness.train.zero`` (``config``, ``launch``, ``rank``, ``partition``, ``resume``); this module is their front.

Two halves:

- ``launch(...)`` runs in the ``run.py`` process. It writes a job spec (the resolved config, the fingerprint, the
  checkpoint directory), starts ``torchrun --standalone --nproc_per_node=<train.world_size>
  scripts/train_distributed.py <spec>`` (several nodes: the rendezvous below), waits, and loads the gathered final
  weights into ``handle.model`` (so the evaluation that follows sees the fine-tuned, EMA-averaged model, exactly as
  with the single-process engine).
- ``train_rank(spec)`` runs in every rank (``scripts/train_distributed.py``). Each rank rebuilds the model and the
  method from the same config (deterministic), reads the same memory-mapped data cache, and trains its disjoint
  slice of every optimizer step (``batches_for_step(step, rank)``) with the step function the single engine uses
  (``harness.train.step.micro_step``, backward through ``engine.backward``).

The DeepSpeed JSON is generated from ``TrainArgs`` by ``ds_config`` (one source of truth): ZeRO stage, CPU offload
(placed *inside* ``zero_optimization``: the controlled study's ``stage3_offload.json`` has ``offload_param`` at the top
level, where DeepSpeed ignores it), bf16, gradient clipping, micro batch x accumulation x world size = global batch.
The LR schedule is the harness's own ``lr_lambda`` passed as a client scheduler; the JSON never has a ``scheduler``
block (in the study's release a DeepSpeed ``WarmupDecayLR`` silently overrides the "constant_with_warmup" it asks for).

Optimizer (``optimizer_kind``; recorded in the row's ``train_info["optimizer"]``): ``train.optimizer=auto`` uses
torch's AdamW as a DeepSpeed client optimizer (``zero_allow_untested_optimizer``), ``fused=True`` on GPU: no
JIT-compiled op, no nvcc on the compute node, the same update rule as the single engine. With CPU offload, ``auto``
uses DeepSpeed's CPU Adam (DeepSpeed refuses a client optimizer with ZeRO-Offload); ``train.optimizer=deepspeed``
asks for DeepSpeed's AdamW anyway (FusedAdam on GPU). Those ops are JIT-compiled (ninja; gcc for CPU Adam, nvcc for
FusedAdam) into ``TORCH_EXTENSIONS_DIR``: ``launch`` builds the op once in the parent process, before torchrun
starts the ranks (``prebuild_optimizer_op``), so the ranks only load the cached build instead of 8 ranks compiling
at once (and a rank killed mid-build leaving the build's ``lock`` file behind, on which every later job waits).

Collectives: every tensor a collective carries lives on the rank's device ``dev`` (``cuda:LOCAL_RANK`` on GPU, where
NCCL refuses CPU tensors; the CPU with gloo): the per-step loss and stop flag (``reduce_step``), the final gather
(``partition.gather_full``), and the EMA partitions read back from a checkpoint (``EMA.load_state_dict``); object
collectives (``broadcast_object_list``, ``all_gather_object``, barriers) use the current CUDA device, set before the
process group starts.

EMA under ZeRO-3: each rank keeps an fp32 EMA of *its own partition* of every parameter (``param.ds_tensor``), updated
after every optimizer step; memory is 4 bytes x params / world_size per rank, and no communication is needed. At the
end every parameter's EMA partitions are all-gathered on rank 0 (not ``GatheredParameters``: ZeRO-3 keeps small
parameters "persistent" and would hand back their last iterate), which writes ``final/model.safetensors``
(loadable in a single process). With bf16 training the EMA follows the bf16 partitions (not the fp32 master copy)
-- a rounding-level difference from an EMA of the master weights. With ZeRO stage 0-2 parameters are not
partitioned and the EMA covers the full tensors.

Resumption: every ``save_every`` steps all ranks write a DeepSpeed checkpoint (model, optimizer partitions, client
scheduler) plus one state per rank (EMA partition and update count, RNG states; tensors + JSON) into a temporary
directory of this run's own; rank 0 publishes it as ``step_N`` under the key's lock
(``harness.train.checkpoint.Store``: ``meta.json`` with step, key, losses and every file's size). The data position
is the step (``batches_for_step``), so a killed run started again with the same command continues with the same
batches. On resume rank 0 holds the lock while every rank checks the newest checkpoint's files (sizes, its own
state file); if any rank finds a bad file, rank 0 warns naming it and all ranks move on to the previous checkpoint
together. DeepSpeed's own files are read with ``torch.load(weights_only=True)`` (a few DeepSpeed classes
allow-listed), never by unpickling arbitrary objects. A corrupt file that keeps its size and fails inside
``engine.load_checkpoint`` fails the run (ranks cannot agree on a fallback from inside DeepSpeed's collective load).

Preemption (Slurm's SIGTERM; submitit's SIGUSR2 before the time limit): torchrun is started with SIGTERM and SIGUSR2
ignored and told not to handle SIGTERM (``--signals-to-handle``), so neither it nor, until they install their
handlers, its ranks die of them. Each rank records SIGUSR2 / SIGTERM (``StopFlag``) and so does ``launch`` in the
parent (``SignalRelay``, in place of ``lifecycle.raise_on_sigterm``'s and submitit's handlers while torchrun runs),
which passes the request on in a file (``<job>/stop_requested``) that every rank checks at each step boundary. At
the boundary the ranks agree (the flag rides on the loss all-reduce, one collective per step, on ``dev``); on a
request they save a checkpoint of the finished step, rank 0 writes ``<job>/preempted.json``, and they exit with
``PREEMPTED_EXIT``. ``launch`` then raises ``Preempted`` ("preempted by SIGTERM: training saved a checkpoint at step
N ..."), or, when the signal was submitit's SIGUSR2, prints that line and hands the signal to submitit's handler,
which requeues the job; the requeued job resumes from that checkpoint. The save must fit in the time Slurm leaves
(``signal_delay_s`` before the time limit; KillWait after a preemption's SIGTERM).

Process lifetime: torchrun gets SIGKILL when the launching process dies (Linux ``PR_SET_PDEATHSIG``; SIGTERM, on
which torchrun stops its ranks, for a torchrun that is not preemptible, e.g. the evaluation's), and every rank watches
its parent and the launching process (``HARNESS_LAUNCHER_PID``) and kills itself within a second of either
disappearing, so a killed ``run.py`` never leaves ranks training and writing checkpoints.

Several nodes (``train.nodes``; ``harness.train.zero.nodes``): every node runs the same ``run.py``; node 0 launches
as above with ``torchrun --nnodes --node_rank=0`` at ``MASTER_ADDR:MASTER_PORT``, every other node joins with its
own node rank (``follow``: its ranks receive the spec from rank 0, it writes no row). ``node_launch`` refuses a
Slurm step whose nodes are not ``train.nodes`` and more ranks per node than the node's GPUs.

Limitations: every rank loads the full model in host memory before DeepSpeed partitions it (no ``zero.Init``);
for LLaMA2-7B in bf16 that is ~13.5 GB per rank.
"""
from __future__ import annotations

from harness.train.zero.config import (
    OPTIMIZERS,
    bf16_enabled,
    client_optimizer,
    ds_config,
    optimizer_kind,
    prebuild_optimizer_op,
    use_ds_optimizer,
)
from harness.train.zero.launch import (
    ENTRY,
    PREEMPTED_EXIT,
    PREEMPTED_FILE,
    STOP_FILE,
    STOP_SIGNALS,
    SignalRelay,
    follow,
    launch,
    load_final,
    node_launch,
    run_torchrun,
    train_job,
    watch_launcher,
    write_spec,
)
from harness.train.zero.partition import gather_full, partition
from harness.train.zero.rank import StopFlag, reduce_step, train_rank
from harness.train.zero.resume import deepspeed_safe_globals, resume, safe_checkpoint_engine, save

__all__ = ["ENTRY", "OPTIMIZERS", "PREEMPTED_EXIT", "PREEMPTED_FILE", "STOP_FILE", "STOP_SIGNALS", "SignalRelay",
           "StopFlag", "bf16_enabled", "client_optimizer", "deepspeed_safe_globals", "ds_config", "gather_full",
           "follow", "launch", "load_final", "node_launch", "optimizer_kind", "partition",
           "prebuild_optimizer_op", "reduce_step", "resume", "run_torchrun", "safe_checkpoint_engine", "save",
           "train_job", "train_rank", "use_ds_optimizer", "watch_launcher", "write_spec"]

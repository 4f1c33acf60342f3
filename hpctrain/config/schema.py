"""Typed structured configs: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` pick a schema through their defaults list (``- /schema/model/gpt@_here_``
style is avoided: each option names its schema as ``_schema_`` via the defaults list), so an unknown key or
a value of the wrong type is rejected while the config is composed, before anything runs.

This module must stay free of torch: it is imported on the submit path. Over 400 lines: it is the one
schema of the whole config tree, a dataclass per group with a comment per key, read as one (a group's keys
split over files would hide the defaults a reader compares).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from hpctrain.faults import FaultsConfig


@dataclass
class LoraConfig:
    """LoRA (Hu et al. 2021): ``W x + (alpha / rank) · B A x`` for each targeted Linear, A (rank × in) and B
    (out × rank) trained, W frozen. ``targets``: module-name patterns (dotted, ``*`` one level; a pattern
    also matches the end of a longer name, as PEFT's ``target_modules`` do); empty: the model's declared
    ``LORA_TARGETS``."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    """The model: ``target`` (the group's ``_target_``: an importable callable returning an ``nn.Module``)
    called with ``args`` (the group's other keys; nested ``_target_``s are instantiated, as in Hydra's
    ``instantiate``). The built-ins are ``hpctrain.models.gpt.GPT`` and ``hpctrain.models.vit.ViT``; what the
    core knows about a model comes from :func:`hpctrain.models.builtin.model_spec`, never from its name."""

    target: str = MISSING
    args: dict[str, Any] = field(default_factory=dict)
    # Start from these weights (a new run: fresh optimizer, step 0): a safetensors file or folder, a torch
    # state dict, a transformers save_pretrained folder, an hpctrain checkpoint or run directory
    # (hpctrain.weights.load). Ignored once the run directory holds a checkpoint of its own.
    init_from: str | None = None
    init_strict: bool = True  # false: load the names that fit, report the rest
    # Parameter-efficient fine-tuning: "none", or "lora" (low-rank adapters beside the modules
    # ``lora.targets`` names, the base weights frozen: hpctrain.models.adapters).
    adapters: str = "none"
    lora: LoraConfig = field(default_factory=LoraConfig)


ADAPTERS = ("none", "lora")
# The model group's own keys (in every composed config: model.init_from=... needs no +).
MODEL_KEYS: dict[str, Any] = {
    "init_from": None,
    "init_strict": True,
    "adapters": "none",
    "lora": {"rank": 8, "alpha": 16.0, "dropout": 0.0, "targets": []},
}


@dataclass
class DataConfig:
    """Where samples come from: a built-in dataset by ``name``, or the user's ``_target_``.

    ``name`` (built-ins): ``synthetic`` (shaped by the model), ``text`` (byte-level Python standard library
    sources), ``digits`` (scikit-learn's 8×8 handwritten digits), ``tokens`` (a memory-mapped token file
    written by ``hpctrain prepare``). ``target`` (the group's ``_target_``): a callable taking
    ``split="train" | "val"`` plus ``args`` (the group's keys that are not hpctrain's) and returning a
    map-style dataset whose items are ``(input, target)`` pairs or dicts.
    """

    name: str | None = None
    path: str | None = None  # the token file, for name=tokens
    num_samples: int = 8192  # synthetic only
    max_bytes: int = 4_000_000  # text only: how much of the corpus to read
    # text, tokens: the windows' length for a model that declares none (a transformers LM whose config
    # gives no n_positions, or a shorter window than it); a built-in model's windows are its model.seq_len.
    seq_len: int | None = None
    val_fraction: float = 0.05  # built-ins: the last fraction of the samples is the validation set
    num_workers: int = 0  # DataLoader worker processes building batches ahead of the training loop
    # How a list of items becomes a batch: a node with ``_target_`` (called as fn(items)), or None for torch's
    # default_collate.
    collate: Any = None
    target_key: str = "labels"  # dict batches: the targets; the model is called with the other keys
    target: str | None = None  # the group's ``_target_``
    args: dict[str, Any] = field(default_factory=dict)


# hpctrain's own keys of the data group, present in every composed config so that a user's data YAML needs
# only its ``_target_`` and arguments while ``data.num_workers=2`` still works without ``+``.
DATA_KEYS: dict[str, Any] = {
    "_target_": None,
    "name": None,
    "path": None,
    "num_samples": 8192,
    "max_bytes": 4_000_000,
    "seq_len": None,
    "val_fraction": 0.05,
    "num_workers": 0,
    "collate": None,
    "target_key": "labels",
}


@dataclass
class LossConfig:
    """The loss: ``target`` called as ``fn(outputs, batch, **args)`` → a scalar tensor. The default is
    cross-entropy over the last dimension (ignore_index=-100); ``loss=model`` uses the model's own loss."""

    target: str = MISSING
    args: dict[str, Any] = field(default_factory=dict)


# The tensor-parallel roles a plan may give a module (implemented by hpctrain.parallel.tp).
TP_ROLES = (
    "colwise",
    "rowwise",
    "norm",
    "gather_sequence",
    "whole_sequence",
    "enter_sequence_shards",
    "vocab_embedding",
    "vocab_head",
    "replicated",
)


@dataclass
class ParallelConfig:
    """How the model is spread over the ranks (torch-native: DDP, FSDP2, DTensor TP, pipelining).

    ``name`` picks the mesh dimensions that exist: ``none`` (one process), ``ddp`` / ``fsdp`` (data parallel:
    replicas / shards over every rank), ``hsdp`` (replicate × shard), ``tp`` (tensor parallel over every
    rank), ``pp`` (pipeline over every rank), ``2d`` (FSDP × TP), ``3d`` (PP × FSDP × TP), ``cp`` (context
    parallel over every rank), ``4d`` (PP × FSDP × CP × TP). A degree of 0 is derived: the one dimension left
    open takes world size / (product of the others). ``ep`` and ``cp`` are added to the sharding strategies
    when given.
    """

    name: str = "ddp"
    # --- degrees (0: derived from the world size, see hpctrain.config.shape)
    pp: int = 0
    dp_replicate: int = 0
    dp_shard: int = 0
    tp: int = 0
    # Expert parallelism: a mixture-of-experts model's experts spread over ep data-parallel ranks, tokens
    # sent to their experts and back by all-to-all (hpctrain.parallel.moe). Given, never derived (0 or 1:
    # none); fsdp, hsdp, 2d, 3d, 4d and cp take it.
    ep: int = 0
    # Context parallelism: every sample's sequence split over cp ranks, attention by a ring of keys and
    # values (hpctrain.parallel.context). Derived under parallel=cp; given elsewhere (4d: 2).
    cp: int = 0
    # --- ddp
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    compression: str = "none"  # none | fp16 | bf16 | powersgd | topk (gradient all-reduce hooks)
    topk_ratio: float = 0.01  # topk: fraction of each bucket's entries sent per step
    powersgd_rank: int = 2  # powersgd: rank of the low-rank approximation
    powersgd_start_step: int = 10  # powersgd: plain all-reduce before this step (Vogels et al. 2019, §4)
    # --- fsdp / hsdp / 2d / 3d: FSDP2 over the dp_shard dimension
    reshard_after_forward: bool = True  # True: ZeRO-3; False: ZeRO-2 (keep gathered weights for backward)
    cpu_offload: bool = False  # parameters, gradients and optimizer state live in host memory
    # --- tp / 2d / 3d
    sequence_parallel: bool = True  # norms and dropout work on sequence shards (Korthikanti et al. 2022)
    # Module-name pattern → role (TP_ROLES); empty: the model's own plan (its TP_PLAN, or a transformers
    # model's base_model_tp_plan). See hpctrain.parallel.tp.
    tp_plan: dict[str, str] = field(default_factory=dict)
    # --- pp / 3d
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b | interleaved_zero_bubble | zbv_zero_bubble
    microbatches: int = 4  # pipeline micro-batches per step, each of trainer.micro_batch_size samples
    # Where a model that does not split itself is cut: {input: [modules], blocks: NAME, output: [modules]};
    # empty: a transformers model's base_model_pp_plan, else the largest block list (hpctrain.parallel.stages)
    pp_split: dict[str, Any] = field(default_factory=dict)
    stages_per_rank: int = 0  # virtual stages; 0: 1 for gpipe/1f1b, 2 for the interleaved and V schedules
    # --- any strategy
    activation_checkpointing: str = "none"  # none | full | selective
    # Class names of the model's repeated blocks: the FSDP units, and what activation checkpointing and
    # compile wrap. Empty: the children of the model's largest nn.ModuleList / ModuleDict
    # (hpctrain.parallel.blocks).
    block_classes: list[str] = field(default_factory=list)
    compile: bool = False  # torch.compile each transformer block
    # Where compile's caches (inductor's FX graphs and kernels, AOTAutograd's graphs) live, so that a
    # requeued or restarted job reuses them: "run" (RUN_DIR/compile_cache/<key>), "off" (torch's default,
    # a folder in this node's /tmp), or an absolute path every node sees (a shared cache: <path>/<key>).
    # <key> is the torch and hpctrain versions, the device and the config parts that change the graphs
    # (hpctrain.parallel.compile.cache_key).
    compile_cache: str = "run"


# cluster.max_restarts when not given, by cluster.kind (ClusterConfig.max_restarts says why).
DEFAULT_RESTARTS = {"slurm": 3, "local": 0}


@dataclass
class ClusterConfig:
    """Where the run executes.

    ``kind=local``: ``nproc`` worker processes on this machine. ``kind=slurm``: a batch job of ``nodes`` ×
    ``tasks_per_node`` tasks (one per GPU on GPU clusters, one per CPU slot on CPU clusters).
    """

    name: str = "local"
    kind: str = "local"  # local | slurm
    # --- local
    nproc: int = 2
    master_addr: str = "127.0.0.1"
    kill_grace_s: float = 5.0  # after one rank failed, how long the others get to stop before SIGKILL
    # Fork the workers from a process that has imported torch once (hpctrain.launch.forked); false: start
    # each as a fresh interpreter. HPCTRAIN_FORKSERVER=PATH names a running server, =off is false.
    fork_server: bool = True
    # --- slurm: what reaches sbatch / srun (validated: no shell metacharacters, or quoted)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"  # any Slurm time format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    # Flexible walltime (sbatch --time-min): the least the job accepts. Backfill may then start it sooner,
    # in a gap shorter than `time`, with a limit between the two; the run reads the limit Slurm granted and
    # saves and requeues before it ends, as before `time`. None: the job runs for `time` or waits for it.
    time_min: str | None = None
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem: str | None = None  # per node, Slurm syntax (e.g. 480G; 0 = all of it)
    constraint: str | None = None
    exclude: str | None = None
    exclusive: bool = False  # whole nodes: no other job shares them
    gres: str | None = None  # generic resources, e.g. gpu:a100:4 (instead of gpus_per_node)
    gpus_per_task: int | None = None
    reservation: str | None = None
    mail_user: str | None = None
    mail_type: str | None = None  # e.g. END,FAIL (hpctrain.slurm.spec.MAIL_TYPES)
    dependency: str | None = None  # e.g. afterok:1234 or singleton
    # Any other sbatch option, {long-option-name: value} (true: a flag). Checked like the keys above; the
    # options hpctrain sets itself are refused here (they have keys of their own).
    additional: dict[str, Any] = field(default_factory=dict)
    job_name: str = "hpctrain"
    signal: str = "USR2"  # warning signal before the time limit; never USR1, which NCCL may take
    signal_lead_s: int = 120
    env: dict[str, str] = field(default_factory=dict)  # exported in the job (values quoted)
    # An example profile (a100x32, h100x64): its partition, account and setup are placeholders, so it is not
    # submitted as it is: copy it into your --config-dir, set your site's values and example: false.
    example: bool = False
    # Names of env whose values are secret (never written anywhere): besides these, a value taken from the
    # environment (${oc.env:NAME}) is secret, and the usual names of secrets (*_KEY, *_TOKEN, ...).
    secret_env: list[str] = field(default_factory=list)
    # Shell lines run in the job script before the tasks start, each verbatim on its own line ($HOME, &&, ~
    # and pipes work as typed), e.g. "module load cuda/12.4" or "source $HOME/venv/bin/activate && cd ~/proj".
    setup: list[str] = field(default_factory=list)
    container_image: str | None = None  # pyxis/enroot: srun --container-image
    container_mounts: list[str] = field(default_factory=list)  # src:dst[:flags]
    # What of the user's project (the submit directory) a job's code snapshot copies, relative to it. Empty:
    # the tracked files of its git repository, else its *.py files and packages (hpctrain.launch.snapshot).
    snapshot_paths: list[str] = field(default_factory=list)
    # Submit from a laptop: [USER@]HOST of the cluster's login node (or a Host alias of the ssh config).
    # Every Slurm command runs there over one multiplexed ssh connection; the run directory is shipped
    # there (hpctrain.slurm.remote). launcher=sbatch (auto picks it); keys or an agent only, no password.
    ssh: str | None = None
    ssh_config: str | None = None  # an ssh config file (ssh -F) instead of ~/.ssh/config: port, key, ...
    # Where run directories go on the cluster: REMOTE_DIR/<the run dir's path below the submit directory>.
    # None: the same absolute path as here.
    remote_dir: str | None = None
    array_parallelism: int = 64  # sweep jobs running at once (per array: %N)
    # Sweep members per job: N members run one after another in one allocation, each in its own run
    # directory with its own resume (hpctrain.launch.submitit_task.run_pack). 1: a job per member.
    pack: int = 1
    sbatch_template: str = "srun"  # for launcher=sbatch: srun (one task per GPU) | torchrun (one per node)
    max_requeues: int = 3
    # --- both
    # Restarts inside the allocation (hpctrain.launch.agent): when a rank exits abnormally or hangs, every
    # rank's worker is started again (forked: no new torch import) from the newest valid checkpoint, in the
    # same job. A separate cap from max_requeues (new jobs): once these are used up, a fault requeues as
    # before. 0: no restart inside the allocation. None (the default): DEFAULT_RESTARTS[kind], i.e. 3 on
    # Slurm (a first fault is answered in seconds, not after the queue) and 0 for cluster=local (a
    # workstation's user watches the run, and the likeliest fault there is a bug of their own, whose
    # traceback a restart would only delay). The same error at the same step twice is never restarted.
    max_restarts: int | None = None
    # A crash loop ends: this many restarts in a row without a single new training step stop the run
    # (FAILED, its cause in one line in `hpctrain status`) instead of burning every restart and requeue.
    max_no_progress: int = 3
    # Health check of each node before its ranks join (hpctrain.launch.agent): the run directory writable
    # with room for a checkpoint, the device answering a tiny computation, and this site script (an
    # absolute path, executable on every node) exiting 0. A node that fails is excluded: the job is requeued
    # without it. None: no site script (the other checks still run under cluster.max_restarts).
    health_check: str | None = None
    # The project's record of nodes that failed its runs (a health check, a hang that came back on the same
    # node, an I/O or device fault, a lost node): each later job of the project leaves out the nodes with
    # evidence younger than bad_node_ttl_h hours (at most half of a partition, never fewer nodes than the
    # job needs). A JSON file to read and edit, relative to the submit directory (an absolute path on a
    # shared file system serves a team); `hpctrain nodes` lists it, `hpctrain nodes --forget NODE` takes a
    # node out. None, or a TTL of 0: no record is read or written (hpctrain.slurm.badnodes).
    bad_node_file: str | None = ".hpctrain/bad_nodes.json"
    bad_node_ttl_h: float = 72.0
    # A lost node (its slurmd gone, its ranks unreachable) does not end the job (hpctrain.launch.agent; both
    # need max_restarts ≥ 1, since the answer is a restart inside the allocation). spare_nodes: the job asks
    # Slurm for this many extra nodes, whose agents wait; a spare takes a lost node's place at the next
    # rendezvous. min_nodes: with no spare left, the job continues on fewer nodes, down to this many (the
    # data-parallel size shrinks, the global batch is kept by more accumulation: config.shape.on_nodes).
    # None: cluster.nodes (no shrinking).
    spare_nodes: int = 0
    min_nodes: int | None = None
    # Mean time between interruptions assumed by trainer.ckpt_every=auto before the run has seen one, hours.
    mtbf_h: float = 24.0
    # Peak dense FLOP/s of one device (data sheet, no sparsity), one per kind of matmul: the planner prices a
    # run's matmuls, and the trainer's MFU is measured, at the peak of the run's precision
    # (hpctrain.precision.matmul_peak: fp32 → peak_fp32_flops, bf16/fp16/fp8 → peak_flops). None: unknown
    # (no step time for that precision in the plan; the trainer looks the GPU's name up, else no MFU).
    # peak_flops keeps its old meaning, the dense bf16 (= fp16) tensor-core peak, so profiles written
    # before the other keys existed still plan bf16 runs as before.
    peak_flops: float | None = None
    peak_fp32_flops: float | None = None  # IEEE float32 on CUDA cores (an fp32 run's matmuls)
    peak_tf32_flops: float | None = None  # TF32 tensor cores (float32 matmuls where TF32 is allowed)
    # Peak dense float8 FLOP/s: what trainer.precision=fp8's float8 matmuls are priced at by the planner.
    # None: priced at peak_flops (no gain assumed).
    peak_fp8_flops: float | None = None
    cost_per_gpu_hour: float | None = None
    dist_timeout_s: int = 300
    # --- planning: `hpctrain plan` and the memory check before every submission (hpctrain.plan)
    gpu_memory_gib: float = 0.0  # memory of one GPU; 0: no GPU, no GPU memory verdict (CPU profiles)
    # Fraction of peak_flops the step-time estimate assumes the matmuls reach (model FLOPs utilisation):
    # well-tuned dense transformer training reaches 0.4-0.55 on A100/H100 (Chowdhery et al. 2022, table 3;
    # Narayanan et al. 2021, section 5.1), small or communication-bound runs less.
    achievable_mfu: float = 0.45
    # Link bandwidths in Gbit/s, one direction, from the data sheets (the planner assumes collectives reach
    # 80% of them). intra: between the GPUs of one node, per GPU (NVLink); inter: of one node to the network,
    # all its NICs together (InfiniBand). None: unknown, no communication time in the estimate.
    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None
    # What the shared file system (or checkpoint.path's store) writes and reads for the whole job, GB/s: the
    # plan's checkpoint save and load, and so its projected ETTR (hpctrain.plan.ettr). None: not projected.
    storage_gbps: float | None = None

    def resolve(self) -> None:
        """Fill in the defaults that depend on ``kind`` (the typed config's readers see plain ints)."""
        if self.max_restarts is None:
            self.max_restarts = DEFAULT_RESTARTS.get(self.kind, 0)

    def peak(self, kind: str) -> float | None:
        """The configured peak FLOP/s of one kind of matmul (one of hpctrain.precision.PEAKS), or None."""
        value: float | None = getattr(self, PEAK_KEYS[kind])
        return value


# The cluster key of each peak (hpctrain.precision.PEAKS): bf16's is peak_flops, its name from before the
# others existed.
PEAK_KEYS = {
    "fp32": "peak_fp32_flops",
    "tf32": "peak_tf32_flops",
    "bf16": "peak_flops",
    "fp8": "peak_fp8_flops",
}


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warmup, then cosine decay to ``lr * min_lr_ratio``)."""

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # adamw: torch's fused kernel (one kernel for every parameter's update: torch.optim.AdamW(fused=True)),
    # instead of its multi-tensor (foreach) one on GPUs. Same update, rounded differently.
    fused: bool = False


@dataclass
class TrainerConfig:
    max_steps: int = 300
    seed: int = 1234
    global_batch_size: int | None = None  # None: micro_batch_size × data-parallel size (no accumulation)
    micro_batch_size: int = 16
    precision: str = "fp32"  # fp32 | bf16 | fp16 | fp8 (bf16 + float8 matmuls: hpctrain.precision)
    # Steps between logged points; null: 25, or often enough for 10 points on a shorter run (a 20-step run
    # logs every 2 steps): log_interval().
    log_every: int | None = None
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batches: int = 4
    # Steps between checkpoints; 0: only at the end; auto: from the measured save cost and the run's
    # interruption rate (Young/Daly: hpctrain.checkpoint.cadence), re-chosen after each interruption.
    ckpt_every: Any = 100
    keep_last: int = 2
    # Write checkpoints in the background (DCP async_save): training waits only for the copy of the state.
    # Saves on a stop signal and at the end are synchronous.
    async_checkpoint: bool = False
    resume: str = "auto"  # auto | never | a checkpoint directory
    # Hang watchdog: a step that runs watchdog_factor × the recent median and at least watchdog_min_s seconds
    # is a hang: every rank dumps its Python stacks, the culprit's node is recorded and excluded, the job
    # requeues. 0 disables it.
    watchdog_factor: float = 20.0
    watchdog_min_s: float = 300.0
    # The CUDA allocator's history with Python stacks, so that a rank that runs out of GPU memory writes
    # what filled it (memory/rank<R>.json: the largest live allocations and where; hpctrain.observe.memory).
    # null: armed once an earlier attempt of the run ran out of memory. Needs a GPU (cluster.gpus_per_node).
    memory_history: bool | None = None
    # A step whose loss or gradient norm is not finite on any rank (all ranks agree, one all-reduce):
    # skip: no optimizer or scheduler step (weights, optimizer state and schedule bitwise as before), logged;
    # more than max_nonfinite_skips in a row stop the run. rollback: reload the newest checkpoint and go on
    # past the batches that went bad. stop: end the run at once, naming the step, saving nothing of it.
    nonfinite: str = "skip"
    max_nonfinite_skips: int = 10
    # Every straggler_every steps the ranks' phase times are gathered and the slowest rank is named in the
    # metrics (0: never).
    straggler_every: int = 50
    # "FIRST:LAST": record a torch.profiler trace of these steps (inclusive) into RUN_DIR/profile/, per rank.
    profile: str | None = None
    # A cluster profile (conf/cluster/<name>.yaml): after each committed checkpoint, rank 0 submits a job
    # of that profile running ``hpctrain eval RUN_DIR --step N`` (--dependency=after:<this job>), in the
    # background: training never waits for it. Slurm runs only.
    eval_job: str | None = None

    def log_interval(self) -> int:
        """Steps between logged points: ``log_every`` when set, else 25, or fewer on a run too short for 10
        points at 25 (a 20-step sweep member logs every 2 steps: its report's loss panel has a curve)."""
        if self.log_every is not None:
            return int(self.log_every)
        return max(1, min(25, self.max_steps // 10))


@dataclass
class CheckpointConfig:
    """How checkpoints are kept beyond the shared one of ``trainer.ckpt_every`` (hpctrain.checkpoint)."""

    # Every K steps each rank's state goes to node-local memory and to a peer node (the fast tier), from which
    # a restart inside the same job loads when it is newer than the shared checkpoint. None: off.
    local_every: int | None = None
    local_path: str = "/dev/shm"  # the node-local directory of the fast tier (memory: tmpfs)
    # A checkpoint writer process that died or failed: its checkpoint is never committed; warn: go on with
    # new writers and a warning; stop: end the run.
    on_writer_failure: str = "warn"
    # Where the shared checkpoints go: null: <run>/checkpoints; an object store's URL (s3://bucket/prefix,
    # gs://…: any fsspec scheme whose package is installed; pip install 'hpctrain[s3]' for s3://). The run
    # directory, logs and metrics stay where they are (hpctrain.rundir.objects).
    path: str | None = None
    # The store's file-system options (fsspec's storage_options), e.g. {endpoint_url: http://host:9000} for a
    # site's own S3-compatible server; never credentials (the client reads them from the environment).
    storage_options: dict[str, Any] = field(default_factory=dict)
    # A call of the store (a part of a shard, a listing, the manifest) that takes longer failed: a store that
    # stops reading mid-upload would otherwise hold a save forever (a save is never timed as a hang).
    store_timeout_s: float = 300.0


@dataclass
class LoggerConfig:
    progress_bar: bool = True
    tensorboard: bool = False  # event files in <run>/tensorboard (tensorboard --logdir <run>), traces beside
    wandb: bool = False
    wandb_project: str = "hpctrain"
    wandb_entity: str | None = None
    wandb_mode: str = "offline"  # offline | online | disabled
    wandb_tags: list[str] = field(default_factory=list)


@dataclass
class TaskConfig:
    """What each rank runs: hpctrain's trainer (``train``), or the user's own script (``script``) with
    hpctrain's launch, rendezvous environment and pre-emption handling (hpctrain.task.script)."""

    name: str = "train"  # train | script
    path: str | None = None  # script: the file, relative to the folder the command is typed in
    args: list[str] = field(default_factory=list)  # script: its command-line arguments
    signal: str = "TERM"  # script: what the pre-emption warning (cluster.signal) is forwarded as


@dataclass
class Config:
    # auto: local processes for cluster.kind=local, submitit for Slurm; sbatch: render sbatch_templates/.
    launcher: str = "auto"
    dry_run: bool = False  # print what would be started or submitted, start nothing
    # Refuse a GPU submission whose estimated memory (hpctrain.plan) exceeds the GPU's; false submits anyway.
    plan_check: bool = True
    # Rehearse every distinct rank's start-up before submitting (hpctrain plan --rehearse: a fake process
    # group, the model on the meta device); a rank that would fail is refused in one line naming it.
    rehearse: bool = False
    # A name for the run: its directory is outputs/NAME (a sweep's multirun/NAME), so the same command again
    # continues it; unset, each run gets a new timestamped directory (hydra.run.dir).
    run: str | None = None
    # model, data and loss are ``_target_`` + arguments of the user's choosing; hpctrain.config.compose turns
    # them into ModelConfig / DataConfig / LossConfig.
    model: Any = field(default_factory=lambda: dict(MODEL_KEYS))
    data: Any = field(default_factory=lambda: dict(DATA_KEYS))
    loss: Any = MISSING
    parallel: ParallelConfig = MISSING
    cluster: ClusterConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # a run directory from before: off
    logger: LoggerConfig = MISSING
    task: TaskConfig = field(default_factory=TaskConfig)  # a run directory written before tasks: train
    # Test-only fault injection (hpctrain.faults); the default group `none` injects nothing.
    faults: FaultsConfig = MISSING


# Groups whose options are ``_target_`` + arguments: their composed node is split by to_typed.
TARGET_GROUPS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "loss": LossConfig}

GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "parallel": {"parallel": ParallelConfig},
    "cluster": {"cluster": ClusterConfig},
    "optim": {"optim": OptimConfig},
    "trainer": {"trainer": TrainerConfig},
    "checkpoint": {"checkpoint": CheckpointConfig},
    "logger": {"logger": LoggerConfig},
    "faults": {"faults": FaultsConfig},
    "task": {"task": TaskConfig},
}

SLURM_ARRAY_LAUNCHER = "hpctrain_slurm"


# Mappings of a group given whole on the command line, without ``+`` for each key.
OPEN_MAPPINGS = {"parallel": ("tp_plan", "pp_split"), "cluster": ("additional",)}


def register_configs() -> None:
    """Register the schemas so that ``conf/<group>/*.yaml`` can extend ``schema/<group>/<name>``.

    Once per process: Hydra's ConfigStore is a process-wide singleton, and building the structured nodes
    is a fifth of a composition's CPU (every composition calls this). Registered again only when the store
    no longer holds them (something cleared it)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    if _registered(cs):
        return
    cs.store(name="hpctrain_schema", node=Config)
    # Sweeps on Slurm: one job array (hydra_plugins/hpctrain_slurm_launcher), chosen by hpctrain.cli.
    cs.store(
        group="hydra/launcher",
        name=SLURM_ARRAY_LAUNCHER,
        provider="hpctrain",
        node={"_target_": "hydra_plugins.hpctrain_slurm_launcher.launcher.SlurmArrayLauncher"},
    )
    from omegaconf import OmegaConf

    for group, schemas in GROUP_SCHEMAS.items():
        for name, node in schemas.items():
            structured = OmegaConf.structured(node)
            for key in OPEN_MAPPINGS.get(group, ()):
                # A whole mapping given at once (parallel.tp_plan={...}) replaces the empty default, which
                # a struct node would refuse as new keys.
                OmegaConf.set_struct(structured[key], False)
            cs.store(group=f"schema/{group}", name=name, node=structured)


def _registered(cs: Any) -> bool:
    """Whether ``cs`` holds what :func:`register_configs` stores (the primary schema, the array launcher
    and every group schema)."""
    repo = cs.repo
    if "hpctrain_schema.yaml" not in repo:
        return False
    if f"{SLURM_ARRAY_LAUNCHER}.yaml" not in repo.get("hydra", {}).get("launcher", {}):
        return False
    schema = repo.get("schema", {})
    return all(
        f"{name}.yaml" in schema.get(group, {})
        for group, schemas in GROUP_SCHEMAS.items()
        for name in schemas
    )

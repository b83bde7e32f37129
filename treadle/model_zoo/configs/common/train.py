"""The ``train`` section of a runnable config: every key, its default and what it does.

Override a key from the command line (``train.max_iter=500 train.step.precision=bf16``)
or in a config that imports this one (``train.max_iter = 500``). Every key is
read by ``DefaultTrainer`` and ``default_setup``; a config without a key
gets the default listed here.

The keys live in one table, ``treadle/config/train_keys.py``, which gives
each its default, its line of doc and the rule validation checks its value
with (a bad value is a one-line error naming the key). This file builds
``train`` from that table; the listing below is the table as
``python -m treadle.config.train_keys`` prints it, and a test keeps the two
the same.

train.output_dir = './output'
    The run's folder: checkpoints, metrics.json, log.txt, config.yaml.
train.init_checkpoint = ''
    Weights loaded at the start when not resuming (e.g. a pre-trained backbone); '' for
    none.
train.max_iter = 1000
    Iterations to train (one iteration = one optimizer update).
train.device = 'auto'
    'auto' picks cuda, then mps, then cpu; or 'cpu', 'cuda', 'cuda:N', 'mps'.
train.num_threads = 'auto'
    CPU threads of torch's operations: 'auto' trains on the CPU with one (more wait for
    each other beside other work), on a GPU with torch's count; None: torch's count; an
    integer: that many. OMP_NUM_THREADS, when set, wins. See docs/performance.md.
train.seed = 0
    Python, numpy and torch are seeded with seed + rank; a negative seed (or None) picks
    one and logs it.
train.log_period = 20
    Iterations between writes to metrics.json, TensorBoard and the console.
train.eval_period = 200
    Iterations between evaluations; 0 evaluates only after training.

train.checkpointer: Periodic checkpoints and model_final; see docs/checkpoints.md.
train.checkpointer.period = 200
    Iterations between periodic checkpoints; 0: none (model_final is still written).
train.checkpointer.max_to_keep = 3
    Periodic checkpoints kept (the oldest are deleted); None keeps every one.
train.checkpointer.async_save = False
    Write periodic checkpoints in a background thread from a copy in host memory
    (training stalls only for the copy); a failed background save stops training at the
    next iteration.
train.checkpointer.format = None
    'file' (one weights-only .pth file) or 'dcp' (a torch.distributed.checkpoint
    directory of per-rank shards, loadable on another world size); None: 'dcp' under
    FSDP, else 'file'.
train.checkpointer.export_safetensors = False
    Also write model_final.safetensors.

train.writers: Experiment trackers, optional extras (pip install "treadle[mlflow]" or
  "treadle[wandb]"); see docs/writers.md.
train.writers.mlflow: MLflow, on when tracking_uri or experiment_name is set.
train.writers.mlflow.tracking_uri = None
    The MLflow server (or file store) to log to.
train.writers.mlflow.experiment_name = None
    The MLflow experiment.
train.writers.mlflow.run_name = None
    The MLflow run's name.
train.writers.mlflow.tags = None
    A dict of tags of the MLflow run.
train.writers.mlflow.log_model = False
    Upload model_final.pth as an artifact at the end.

train.writers.wandb: Weights & Biases, on when project is set.
train.writers.wandb.project = None
    The W&B project.
train.writers.wandb.name = None
    The W&B run's name.
train.writers.wandb.mode = 'online'
    'online', 'offline' or 'disabled'.
train.writers.wandb.entity = None
    The W&B team or user.
train.writers.wandb.tags = None
    A list of tags of the W&B run.

train.step: The step object that runs each iteration; a LazyCall of a StepBase class
  instead is a research loop.
train.step.kind = 'eager'
    'eager', or 'compiled' (through torch.compile).
train.step.precision = 'fp32'
    'fp32', 'bf16' (autocast, CPU or GPU) or 'fp16' (autocast on CUDA, with a
    GradScaler).
train.step.grad_accum_steps = 1
    Micro-batches whose gradients make one optimizer update.
train.step.clip_grad_norm = None
    Clip the gradients' total norm to this; None: no clipping.
train.step.clip_grad_value = None
    Clamp each gradient element to [-value, value]; None: no clipping. Not with
    clip_grad_norm.
train.step.loss_fn = None
    loss = loss_fn(model(inputs), targets) on (inputs, targets) batches,
    loss_fn(model(**rest), batch['labels']) on dict batches (the model gets the batch
    without its 'labels'); None: the model returns its loss.

train.step.compile: torch.compile's options, for kind='compiled'.
train.step.compile.mode = None
    torch.compile's mode; 'reduce-overhead' uses CUDA graphs on GPU.
train.step.compile.backend = 'inductor'
    torch.compile's backend.
train.step.compile.fullgraph = False
    Fail on a graph break instead of splitting the graph.
train.step.compile.dynamic = None
    Compile for dynamic shapes (True), static ones (False) or decide on a recompile
    (None).

train.ddp: How the model is wrapped when more than one process trains; the options of
  the other kind stay at their defaults. See docs/distributed.md.
train.ddp.kind = 'ddp'
    'ddp' (DistributedDataParallel) or 'fsdp' (FSDP2 sharding).
train.ddp.broadcast_buffers = False
    DDP: broadcast rank 0's buffers before each forward.
train.ddp.find_unused_parameters = False
    DDP: allow parameters that get no gradient in a step.
train.ddp.fp16_compression = False
    DDP: all-reduce gradients in fp16 (half the traffic).
train.ddp.gradient_as_bucket_view = False
    DDP: gradients are views into the all-reduce buckets (less memory).
train.ddp.static_graph = False
    DDP: the set of used parameters never changes between steps.
train.ddp.bucket_cap_mb = None
    DDP: the all-reduce bucket size in MiB; None: torch's.
train.ddp.reshard_after_forward = True
    FSDP: free the gathered parameters after forward (less memory, one more all-gather
    in backward).
train.ddp.param_dtype = None
    FSDP: the dtype of the gathered parameters; None: theirs.
train.ddp.reduce_dtype = None
    FSDP: the dtype of the gradient reduction; None: theirs.
train.ddp.sync_module_states = True
    FSDP: broadcast rank 0's initial weights first, as DDP does.

train.ema: Exponential moving average of the weights (the EMA hook).
train.ema.enabled = False
    Keep an exponential moving average of the weights; evaluate with it.
train.ema.decay = 0.999
    The old average's weight per update.

train.best_checkpointer: model_best, saved when an evaluation metric improves.
train.best_checkpointer.metric = None
    Save model_best when this evaluation metric improves; None: off.
train.best_checkpointer.mode = None
    'max' or 'min'; None follows the metric: 'min' for losses, errors, cer, wer,
    perplexity, else 'max'.

train.early_stopping: Stopping when an evaluation metric stops improving.
train.early_stopping.metric = None
    Stop when this evaluation metric has not improved for `patience` evaluations; None:
    off.
train.early_stopping.patience = 5
    Evaluations without improvement before stopping.
train.early_stopping.min_delta = 0.0
    The smallest change that counts as an improvement.
train.early_stopping.mode = None
    'max' or 'min'; None follows the metric, as best_checkpointer.mode.

train.handle_preemption = True
    On SIGTERM/SIGUSR1: checkpoint at the next step and exit with status 75.
train.dist_timeout = 300
    Seconds a process waits for the others: joining the process group and in each
    collective; past it, it exits (one line) so that torchrun can restart the group. See
    docs/distributed.md.
train.nonfinite_check = 'flush'
    When to look for NaN losses: 'flush' (no extra sync), 'step' (every iteration) or
    'off'.
train.cudnn_benchmark = False
    torch.backends.cudnn.benchmark on CUDA: faster convolutions for fixed input sizes,
    not bit-reproducible.

"""

from treadle.config.train_keys import train_defaults

train = train_defaults()

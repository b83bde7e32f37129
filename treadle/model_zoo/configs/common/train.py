"""Defaults of the ``train`` section of a runnable config.

Every key is read by ``DefaultTrainer`` / ``default_setup``; override from the
command line, e.g. ``train.max_iter=500 train.step.precision=bf16``.
"""

train = dict(
    output_dir="./output",
    # Weights loaded at the start when not resuming (e.g. a pre-trained backbone).
    init_checkpoint="",
    max_iter=1000,
    # "auto" picks cuda, then mps, then cpu.
    device="auto",
    # Python, numpy and torch are seeded with seed + rank; a negative seed picks one and logs it.
    seed=0,
    log_period=20,
    # 0 evaluates only after training.
    eval_period=200,
    # async_save: write periodic checkpoints in a background thread from a copy in
    # host memory (training stalls only for the copy); a failed background save
    # stops training at the next iteration, the previous checkpoint staying the
    # resume point. format: "file" (one weights-only .pth file) or "dcp" (a
    # torch.distributed.checkpoint directory that each rank writes its shards
    # into, loadable on another world size); None picks "dcp" under FSDP and
    # "file" otherwise. export_safetensors: also write model_final.safetensors.
    # See docs/checkpoints.md.
    checkpointer=dict(period=200, max_to_keep=3, async_save=False, format=None, export_safetensors=False),
    # Experiment trackers (optional extras, pip install "treadle[mlflow]" or
    # "treadle[wandb]"): MLflow is on when tracking_uri or experiment_name is
    # set, W&B when project is set. See docs/writers.md.
    writers=dict(
        mlflow=dict(tracking_uri=None, experiment_name=None, run_name=None, tags=None, log_model=False),
        wandb=dict(project=None, name=None, mode="online", entity=None, tags=None),
    ),
    step=dict(
        kind="eager",  # or "compiled" (torch.compile)
        precision="fp32",  # "bf16" (CPU or GPU) or "fp16" (CUDA, with a GradScaler)
        grad_accum_steps=1,
        clip_grad_norm=None,
        loss_fn=None,  # None: the model returns its loss
        compile=dict(mode=None, backend="inductor", fullgraph=False, dynamic=None),
    ),
    # How the model is wrapped when more than one process trains: kind="ddp"
    # (DistributedDataParallel, with the options below) or kind="fsdp" (FSDP2
    # sharding; its options: reshard_after_forward, param_dtype, reduce_dtype,
    # sync_module_states; the DDP options must then stay off). See docs/distributed.md.
    ddp=dict(kind="ddp", broadcast_buffers=False, find_unused_parameters=False, fp16_compression=False),
    ema=dict(enabled=False, decay=0.999),
    # Save model_best when this evaluation metric improves (None: off). mode None
    # follows the metric: "min" for losses, errors, cer, wer, perplexity; else "max".
    best_checkpointer=dict(metric=None, mode=None),
    # Stop when this metric has not improved for `patience` evaluations (None: off).
    early_stopping=dict(metric=None, patience=5, min_delta=0.0, mode=None),
    # Checkpoint and exit with status 75 on SIGTERM/SIGUSR1.
    handle_preemption=True,
    # When to look for NaN losses: "flush" (no extra sync), "step" (every iteration) or "off".
    nonfinite_check="flush",
)

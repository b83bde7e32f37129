"""Bad inputs to tools/train_net.py never damage a run's folder.

Every case runs twice against a folder holding a finished run: as a fresh
start and with ``--resume``. Each must end with its exit status (2: the job
was asked for wrongly), exactly one line on stderr naming the culprit, no
traceback anywhere, and every file of the folder byte-identical.

A used folder is refused before anything is built (the refusal is the job's
first line, see tests/tools/test_train_net.py): an object that fails to build
is named in a fresh start that may use the folder, ``--move-aside`` (which
then moves nothing), and on ``--resume``.

The cases run in-process through ``cli`` (what ``tools/train_net.py`` calls),
with the output captured at the file-descriptor level; a few run the real
script in a subprocess, the way users run it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, NamedTuple, Tuple

import pytest

from treadle.tools.train_net import cli

from tests.run_files import snapshot

ROOT = Path(__file__).resolve().parents[2]
TRAIN_NET = ROOT / "tools" / "train_net.py"
FAST = ["train.eval_period=20", "train.checkpointer.period=20", "train.log_period=10", "lr_multiplier.warmup_iters=5"]


class Case(NamedTuple):
    argv: Tuple[str, ...]
    culprit: str  # a text the error line must contain
    modes: Tuple[str, ...] = ("fresh", "resume")
    code: int = 2


def case(*argv: str, culprit: str, modes: Tuple[str, ...] = ("fresh", "resume"), code: int = 2) -> Case:
    return Case(tuple(argv), culprit, modes, code)


#: The modes of a case whose error comes from building an object: where the folder may be used.
BUILT = ("move-aside", "resume")


def _config_file(name: str, text: str) -> str:
    return f"@config:{name}:{text}"


CASES: List[Case] = [
    # train.* values: type, range, choices
    case("train.max_iter=abc", culprit="train.max_iter must be an integer >= 1, got 'abc'"),
    # top-level nodes that no code reads; LiBai's graph node
    case("+tokenization.tokenizer=bert", culprit="The config's top-level node 'tokenization' is read by nothing"),
    case("+optim.lr=0.1", culprit="top-level node 'optim' is read by nothing: did you mean 'optimizer'?"),
    case("+graph.enabled=false", "train.step.kind=compiled",
         culprit="graph.enabled=False asks for the eager step and train.step.kind='compiled'"),
    case("+graph.enabled=true", "train.step.kind=eager",
         culprit="graph.enabled=True asks for the compiled step and train.step.kind='eager' for the eager one: "
                 "give train.step.kind only (treadle's key)"),
    # LiBai's config.py turns graph mode on; the command line asks for the eager step
    case(
        "--config-file",
        _config_file(
            "graph.py",
            "from treadle.config import LazyConfig\n"
            f"_all = LazyConfig.load({str(ROOT / 'configs' / 'digits_mlp.py')!r})\n"
            "model, optimizer, dataloader, train, lr_multiplier = "
            "_all.model, _all.optimizer, _all.dataloader, _all.train, _all.lr_multiplier\n"
            "graph = dict(enabled=True)\n",
        ),
        "train.step.kind=eager",
        culprit="graph.enabled=True asks for the compiled step and train.step.kind='eager'",
    ),
    case("+graph.debug=-1", culprit="graph.debug is a setting of LiBai's OneFlow graph"),
    case("+graph.enabled=1", culprit="graph.enabled must be True or False, got 1"),
    case("train.max_iter=0", culprit="train.max_iter must be an integer >= 1, got 0"),
    case("train.max_iter=-5", culprit="train.max_iter"),
    case("train.max_iter=1.5", culprit="train.max_iter"),
    case("train.max_iter=true", culprit="train.max_iter"),
    case("train.max_iter=${train.nope}", culprit="train.max_iter = '${train.nope}' cannot be resolved"),
    case("train.max_iter=???", culprit="train.max_iter has no value"),
    case("train.device=cuda", culprit="train.device='cuda', but CUDA is not available"),
    case("train.device=cuda:3", culprit="train.device='cuda:3'"),
    case("train.device=tpu", culprit="train.device='tpu'"),
    case("train.device=42", culprit="train.device must be"),
    case("train.seed=abc", culprit="train.seed"),
    case("train.log_period=0", culprit="train.log_period must be an integer >= 1, got 0"),
    case("train.log_period=abc", culprit="train.log_period"),
    case("train.eval_period=-1", culprit="train.eval_period"),
    case("train.eval_period=1.5", culprit="train.eval_period"),
    case("train.checkpointer.period=-1", culprit="train.checkpointer.period"),
    case("train.checkpointer.period=abc", culprit="train.checkpointer.period"),
    case("train.checkpointer.max_to_keep=0", culprit="train.checkpointer.max_to_keep"),
    case("train.step.kind=lazy", culprit="train.step.kind must be one of 'eager', 'compiled'; got 'lazy'"),
    case("train.step.precision=fp8", culprit="train.step.precision must be one of 'fp32', 'bf16', 'fp16'; got 'fp8'"),
    case("train.step.precision=fp16", culprit="train.step.precision='fp16' needs a CUDA device"),
    case("train.step.grad_accum_steps=0", culprit="train.step.grad_accum_steps"),
    case("train.step.clip_grad_norm=-1", culprit="train.step.clip_grad_norm"),
    case("train.step.clip_grad_value=0", culprit="train.step.clip_grad_value must be a positive number or None, got 0"),
    case("train.step.clip_grad_value=0.5", "train.step.clip_grad_norm=1.0",
         culprit="train.step.clip_grad_norm=1.0 and train.step.clip_grad_value=0.5: clip by norm or by value, not both"),
    case("train.step.compile.mode=fast", culprit="train.step.compile.mode"),
    case("train.step.compile.fullgraph=maybe", culprit="train.step.compile.fullgraph"),
    case("train.step.compile.backend=nope", culprit="train.step.compile.backend='nope' is not a torch.compile backend"),
    case("train.ddp.kind=zero", culprit="train.ddp.kind must be one of 'ddp', 'fsdp'"),
    case("train.ddp.find_unused_parameters=yes", culprit="train.ddp.find_unused_parameters"),
    case("train.ddp.param_dtype=fp64", culprit="train.ddp.param_dtype"),
    case("train.ema.enabled=1", culprit="train.ema.enabled must be true or false"),
    case("train.ema.decay=1.5", culprit="train.ema.decay must be a number in (0, 1)"),
    case("train.best_checkpointer.metric=bogus_metric", culprit="train.best_checkpointer.metric='bogus_metric'"),
    case("train.best_checkpointer.mode=up", culprit="train.best_checkpointer.mode"),
    case("train.early_stopping.metric=acuracy", culprit="did you mean 'accuracy'"),
    case("train.early_stopping.metric=accuracy", "train.early_stopping.patience=0", culprit="train.early_stopping.patience"),
    case("train.early_stopping.min_delta=-1", culprit="train.early_stopping.min_delta"),
    case("train.handle_preemption=maybe", culprit="train.handle_preemption"),
    case("train.nonfinite_check=sometimes", culprit="train.nonfinite_check must be one of 'flush', 'step', 'off'"),
    case("train.output_dir=", culprit="train.output_dir must be a non-empty path (a str or os.PathLike), got ''"),
    case("train.init_checkpoint=/no/such/weights.pth", culprit="/no/such/weights.pth", modes=("fresh",)),
    case("train.init_checkpoint=/tmp", culprit="'/tmp' is a directory, not a checkpoint file", modes=("fresh",)),
    case("train.seed=99999999999999999999", culprit="train.seed=99999999999999999999 is too large"),
    case("train.step=None", culprit="train.step must be a config node, got None"),
    case("train.checkpointer=None", culprit="train.checkpointer must be a config node"),
    case("optimizer=None", culprit="optimizer must be a config node"),
    case("train=None", culprit="train must be a config node"),
    case("dataloader.test=None", culprit="train.best_checkpointer.metric='accuracy' watches an evaluation, and dataloader.test is None"),
    case("train.max_iter=[1", culprit="train.max_iter must be an integer >= 1, got '[1'"),
    # the run's own weights must fit the model it continues or evaluates
    case("model.hidden_dims=[256,64]", culprit="Cannot resume from", modes=("resume",)),
    case("model.hidden_dims=[32]", "--eval-only", "train.init_checkpoint=@run/model_final.pth",
         culprit="The model does not match the weights in checkpoint", modes=("fresh",)),
    case("model.hidden_dims=[32]", "--eval-only", culprit="The model does not match the weights", modes=("resume",)),
    # ... and the optimizer it continues: the same parameter groups
    case("optimizer.params.weight_decay_bias=1e-4", "optimizer.params.weight_decay_norm=1e-4",
         culprit="Cannot resume from @run/model_final.pth: The optimizer state ('optimizer') in "
                 "'@run/model_final.pth' has 2 parameter group(s)", modes=("resume",)),
    # overrides themselves
    case("train.max_iters=5", culprit="did you mean 'train.max_iter'"),
    case("trian.max_iter=5", culprit="trian.max_iter"),
    case("+train.max_iter=5", culprit="already exists"),
    case("train.max_iter", culprit="train.max_iter"),
    # the other sections, and the objects they build
    case("model._target_=treadle.models.NoSuchModel", culprit="treadle.models.NoSuchModel", modes=BUILT),
    case("+model.num_layers=3", culprit="num_layers", modes=BUILT),
    case("model.hidden_dims=abc", culprit="hidden_dims must be a sequence of ints, got 'abc'", modes=BUILT),
    case("dataloader.test.batch_size=0", culprit="Cannot build the run", modes=BUILT),
    case("optimizer.lr=-1", culprit="optimizer.lr must be a number >= 0, got -1"),
    case("optimizer.lr=abc", culprit="optimizer.lr"),
    case("optimizer.weight_decay=-0.1", culprit="optimizer.weight_decay"),
    case("optimizer.momentum=-1", culprit="optimizer.momentum"),
    case("dataloader.train.total_batch_size=0", culprit="dataloader.train.total_batch_size must be an integer >= 1, got 0"),
    case("dataloader.train.total_batch_size=abc", culprit="dataloader.train.total_batch_size"),
    case("dataloader.train.num_workers=-1", culprit="dataloader.train.num_workers must be an integer >= 0, got -1"),
    case("dataloader.evaluator.metrics=[accuracy,bogus_metric]", culprit="unknown metric 'bogus_metric'"),
    case("lr_multiplier.name=bogus", culprit="bogus", modes=BUILT),
    case("train.step.loss_fn._target_=torch.nn.NoSuchLoss", culprit="torch.nn.NoSuchLoss", modes=BUILT),
    # ... which a fresh start in the used folder does not reach: the folder is refused first
    case("model._target_=treadle.models.NoSuchModel", culprit="holds an earlier run", modes=("fresh",)),
    # config files
    case("--config-file", "/no/such/config.py", culprit="/no/such/config.py"),
    case("--config-file", _config_file("syntax.py", "train = dict(\n  oops oops\n)\n"), culprit="syntax.py"),
    case("--config-file", _config_file("raises.py", "raise RuntimeError('broken config')\n"), culprit="broken config"),
    case(
        "--config-file",
        _config_file(
            "no_model.py",
            "from treadle.config import LazyConfig\n"
            f"_all = LazyConfig.load({str(ROOT / 'configs' / 'digits_mlp.py')!r})\n"
            "optimizer, dataloader, train, lr_multiplier = _all.optimizer, _all.dataloader, _all.train, _all.lr_multiplier\n",
        ),
        culprit="has no 'model'",
    ),
    case("--config-file", _config_file("no_train.py", "model = dict(a=1)\n"), culprit="no 'train'"),
    # docs/config.md's example once had a plain dict here: it was iterated as the loader, at iteration 0
    case(
        "--config-file",
        _config_file(
            "dict_loader.py",
            "from treadle.config import LazyConfig\n"
            f"_all = LazyConfig.load({str(ROOT / 'configs' / 'digits_mlp.py')!r})\n"
            "model, optimizer, train, lr_multiplier = _all.model, _all.optimizer, _all.train, _all.lr_multiplier\n"
            "dataloader = _all.dataloader\n"
            "dataloader.train = dict(total_batch_size=8, num_workers=0)\n",
        ),
        culprit="dataloader.train is a plain dict (keys: total_batch_size, num_workers), not a loader",
    ),
    # the command line
    case("--num-gpus", "0", culprit="--num-gpus must be an integer >= 1, got 0"),
    case("--num-gpus", "abc", culprit="--num-gpus"),
    case("--num-machines", "0", culprit="--num-machines"),
    case("--machine-rank", "3", culprit="--machine-rank"),
    case("--num-gpus", "2", "dataloader.train.total_batch_size=3", culprit="not divisible by the world size 2"),
    case("--resum", culprit="unrecognized arguments: --resum", modes=("fresh",)),
    case("--bogus-flag", culprit="--bogus-flag"),
    case("--move-aside", "--resume", culprit="give one", modes=("fresh",)),
    case("--move-aside", "--eval-only", culprit="--eval-only trains nothing", modes=("fresh",)),
    case("--eval-only", culprit="--eval-only needs weights", modes=("fresh",)),
    case("--eval-only", "train.init_checkpoint=/no/such.pth", culprit="/no/such.pth", modes=("fresh",)),
    # a broken train.init_checkpoint is named as itself, not the used folder
    case("train.init_checkpoint=@run/log.txt", culprit="Cannot load checkpoint '@run/log.txt'", modes=("fresh",)),
    # the folder itself: a fresh start over a finished run
    case(culprit="holds an earlier run", modes=("fresh",)),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    result = subprocess.run(
        [sys.executable, str(TRAIN_NET), f"train.output_dir={out}", "train.max_iter=40", *FAST],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _argv(c: Case, folder: Path, tmp: Path, mode: str) -> List[str]:
    argv = []
    for arg in c.argv:
        arg = arg.replace("@run", str(folder))
        if arg.startswith("@config:"):
            _, name, text = arg.split(":", 2)
            path = tmp / name
            path.write_text(text)
            arg = str(path)
        argv.append(arg)
    # Appended last but overridden by a case's own train.output_dir= (the last override wins).
    return [f"train.output_dir={folder}", *FAST, *argv] + {"fresh": [], "resume": ["--resume"], "move-aside": ["--move-aside"]}[mode]


def _ids() -> List[str]:
    out = []
    for c in CASES:
        for mode in c.modes:
            out.append(f"{mode}:{' '.join(c.argv)[:60] or 'no-arguments'}")
    return out


PARAMS = [(c, mode) for c in CASES for mode in c.modes]


def test_there_are_at_least_60_cases():
    assert len(CASES) >= 60 and len(PARAMS) >= 120


@pytest.mark.parametrize("bad_case,mode", PARAMS, ids=_ids())
def test_bad_input_is_one_line_and_changes_nothing(bad_case, mode, finished_run, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(ROOT)  # as users run it, from the checkout (config files import configs.*)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # build errors leave their traceback there
    before = snapshot(finished_run)
    code = cli(_argv(bad_case, finished_run, tmp_path, mode))
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == bad_case.code, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    assert bad_case.culprit.replace("@run", str(finished_run)) in lines[0], lines[0]
    assert lines[0].startswith(("train_net.py: error: ", "__main__.py: error: ", "pytest: error: ")) or ": error: " in lines[0]
    assert "Traceback" not in out + err
    assert snapshot(finished_run) == before


@pytest.mark.parametrize(
    "argv,culprit",
    [
        (["train.max_iter=abc"], "train.max_iter must be an integer"),
        (["--num-gpus", "0"], "--num-gpus must be an integer >= 1"),
        (["--num-gpus", "2", "+model.num_layers=3", "--move-aside"], "num_layers"),
        (["--num-gpus", "2", "+model.num_layers=3"], "holds an earlier run"),
        ([], "holds an earlier run"),
    ],
)
def test_bad_input_through_the_script(argv, culprit, finished_run):
    """The real script, in its own process: same one line, same untouched folder."""
    before = snapshot(finished_run)
    result = subprocess.run(
        [sys.executable, str(TRAIN_NET), f"train.output_dir={finished_run}", *FAST, *argv],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and culprit in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert snapshot(finished_run) == before


def test_a_raw_pickle_init_checkpoint_is_refused_in_one_line_through_the_script(tmp_path):
    """Weights saved with pickle.dump (not torch.save): torch's warning about
    the pickle protocol is not printed before the refusal, which is the only line."""
    import pickle

    import torch

    raw = tmp_path / "backbone.pkl"
    with open(raw, "wb") as f:
        pickle.dump({"model": {"weight": torch.ones(2, 2)}}, f, protocol=4)
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(TRAIN_NET), f"train.output_dir={out}", *FAST, "train.max_iter=2",
         f"train.init_checkpoint={raw}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"train_net.py: error: Cannot load checkpoint '{raw}': it is corrupt or not a "
                               "plain-data torch checkpoint (weights-only unpickling stopped at: "), lines[0]
    assert not out.exists()


def test_every_checkpoint_corrupt_on_resume_is_one_line_and_changes_nothing(finished_run, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for ckpt in run.glob("*.pth"):
        ckpt.write_bytes(ckpt.read_bytes()[:100])
    before = snapshot(run)
    code = cli([f"train.output_dir={run}", *FAST, "--resume"])
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Cannot resume" in lines[0], err
    assert "Traceback" not in out + err
    assert snapshot(run) == before


def test_a_full_disk_writing_config_yaml_is_one_line_naming_it(tmp_path, capfd, monkeypatch):
    # As a full disk at a checkpoint is: the file and the OS error, not a bare "[Errno 28]".
    import errno

    from treadle.engine import defaults

    def full_disk(path, write, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(defaults, "atomic_write", full_disk)
    run = tmp_path / "run"
    code = cli([f"train.output_dir={run}", *FAST, "train.max_iter=2"])
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err[-2000:]
    assert f"'{run / 'config.yaml'}': No space left on device (ENOSPC)" in lines[0], lines[0]
    assert "Traceback" not in out + err


def test_a_full_disk_writing_metrics_json_is_one_line_naming_it(tmp_path, capfd, monkeypatch):
    # /dev/full fails every write with ENOSPC, as a disk with a few KB left
    # fails the flush of metrics.json before the checkpoint that follows.
    from treadle.events import writer as writer_module

    real_open = writer_module._open_for_append

    def open_on_a_full_disk(path):
        return open("/dev/full", "a", encoding="utf-8") if path.endswith("metrics.json") else real_open(path)

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(writer_module, "_open_for_append", open_on_a_full_disk)
    run = tmp_path / "run"
    code = cli([f"train.output_dir={run}", *FAST, "train.max_iter=12"])
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert f"'{run / 'metrics.json'}': No space left on device (ENOSPC)" in lines[0], lines[0]
    assert "Traceback" not in out + err


def test_a_full_disk_writing_the_tensorboard_file_is_one_line_naming_it_and_no_thread_traceback(
    tmp_path, capfd, monkeypatch
):
    import errno

    from tensorboard.compat.tensorflow_stub.io import gfile

    def full_disk(self, filename, file_content, mode):
        # As a disk with a few KB left: the event file is created, its bytes find no room.
        open(filename, mode).close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(gfile.LocalFileSystem, "_write", full_disk)
    run = tmp_path / "run"
    code = cli([f"train.output_dir={run}", *FAST, "train.max_iter=12"])
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert "No space left on device (ENOSPC)" in lines[0] and f"'{run}/events.out.tfevents." in lines[0], lines[0]
    assert "Traceback" not in out + err

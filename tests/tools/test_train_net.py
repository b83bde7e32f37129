"""tools/train_net.py end to end, and its one-line errors for bad input."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from treadle.config import LazyConfig
from treadle.data import DataStream
from treadle.engine import StepBase, Update
from treadle.events import ScalarKind
from treadle.tools.train_net import cli

ROOT = Path(__file__).resolve().parents[2]
TRAIN_NET = ROOT / "tools" / "train_net.py"
DIGITS = ROOT / "configs" / "digits_mlp.py"


def run_job(*args, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, str(TRAIN_NET), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def metrics(path):
    return [json.loads(line) for line in (path / "metrics.json").read_text().splitlines()]


def test_train_resume_to_larger_max_iter_then_eval_only(tmp_path):
    out = tmp_path / "run"
    common = [f"train.output_dir={out}", "train.eval_period=20", "train.checkpointer.period=20", "train.log_period=10", "lr_multiplier.warmup_iters=5"]
    first = run_job(*common, "train.max_iter=40")
    assert first.returncode == 0, first.stderr[-3000:]
    for name in ("metrics.json", "config.yaml", "last_checkpoint", "model_final.pth", "model_0000019.pth", "log.txt"):
        assert (out / name).exists(), name
    assert list(out.glob("events.out.tfevents.*"))
    assert LazyConfig.load(str(out / "config.yaml")).train.max_iter == 40
    lines = metrics(out)
    assert [line["iteration"] for line in lines if "total_loss" in line] == [9, 19, 29, 39]
    assert [line["iteration"] for line in lines if "accuracy" in line] == [19, 40]
    assert (out / "last_checkpoint").read_text().strip() == "model_final.pth"

    second = run_job(*common, "train.max_iter=60", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Starting training from iteration 40" in second.stdout
    lines = metrics(out)
    train_iters = [line["iteration"] for line in lines if "total_loss" in line]
    assert train_iters == [9, 19, 29, 39, 49, 59]  # each once
    final = torch.load(out / "model_final.pth", weights_only=True)
    assert final["iteration"] == 59 and final["trainer"]["iteration"] == 59

    acc = EventAccumulator(str(out))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("total_loss")]
    assert steps == sorted(set(steps)) and steps[-1] == 59

    third = run_job(*common, "--eval-only", f"train.init_checkpoint={out / 'model_final.pth'}")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "accuracy" in third.stdout and "Evaluation of" in third.stdout

    # Resuming the finished run says so and trains nothing.
    again = run_job(*common, "train.max_iter=60", "--resume")
    assert again.returncode == 0
    assert "has finished already" in again.stdout
    assert [line["iteration"] for line in metrics(out) if "total_loss" in line] == train_iters


@pytest.mark.slow
def test_default_digits_job_reaches_95_percent(tmp_path):
    out = tmp_path / "digits"
    result = run_job(f"train.output_dir={out}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    final_eval = [line for line in metrics(out) if "accuracy" in line][-1]
    assert final_eval["iteration"] == 1500
    assert final_eval["accuracy"] >= 0.95, final_eval


def error_of(argv, capsys):
    code = cli(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def test_missing_config_file(capsys, tmp_path):
    code, err = error_of(["--config-file", str(tmp_path / "nope.py")], capsys)
    assert code == 2 and "nope.py" in err and len(err.splitlines()) == 1


def test_syntax_error_names_file_and_line(capsys, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("train = dict(\n    max_iter=3,\n    oops oops\n)\n")
    code, err = error_of(["--config-file", str(bad)], capsys)
    assert code == 2 and "bad.py" in err and "line 3" in err and len(err.splitlines()) == 1


def test_unknown_override_key_suggests_the_closest(capsys, tmp_path):
    code, err = error_of([f"train.output_dir={tmp_path}", "train.max_iters=5"], capsys)
    assert code == 2 and "train.max_iters" in err and "train.max_iter" in err and len(err.splitlines()) == 1


def test_malformed_override(capsys):
    code, err = error_of(["train.max_iter"], capsys)
    assert code == 2 and "train.max_iter" in err and len(err.splitlines()) == 1


def test_target_that_cannot_be_imported(capsys, tmp_path):
    code, err = error_of([f"train.output_dir={tmp_path}", "model._target_=treadle.models.NoSuchModel"], capsys)
    assert code == 2 and "treadle.models.NoSuchModel" in err and "model" in err and len(err.splitlines()) == 1


def test_wrong_argument_to_a_target_names_the_node(capsys, tmp_path):
    code, err = error_of([f"train.output_dir={tmp_path}", "+model.num_layers=3"], capsys)
    assert code == 2 and "'model'" in err and "num_layers" in err and len(err.splitlines()) == 1


def test_unwritable_output_directory(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code, err = error_of([f"train.output_dir={blocker / 'out'}", "train.max_iter=1"], capsys)
    assert code == 2 and "cannot be written" in err and str(blocker) in err and len(err.splitlines()) == 1


def test_eval_only_without_weights(capsys, tmp_path):
    code, err = error_of(["--eval-only", f"train.output_dir={tmp_path}"], capsys)
    assert code == 2 and "--eval-only needs weights" in err and "train.init_checkpoint" in err


def test_eval_only_without_weights_leaves_the_runs_config_alone(capsys, tmp_path):
    """The weights are looked for before anything is written to the run's directory."""
    (tmp_path / "config.yaml").write_text("the training run's config\n")
    code, err = error_of(["--eval-only", f"train.output_dir={tmp_path}"], capsys)
    assert code == 2 and "--eval-only needs weights" in err
    assert (tmp_path / "config.yaml").read_text() == "the training run's config\n"
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]


def test_resume_without_checkpoint_warns_and_starts_fresh(tmp_path, treadle_caplog):
    code = cli(["--resume", f"train.output_dir={tmp_path}", "train.max_iter=5", "train.eval_period=0", "lr_multiplier.warmup_iters=0"])
    assert code == 0
    assert "No checkpoint found" in treadle_caplog.text or "no checkpoint" in treadle_caplog.text.lower()
    assert (tmp_path / "model_final.pth").exists()
    assert "Starting training from iteration 0" in treadle_caplog.text


def test_resume_with_a_broken_init_checkpoint_says_so_in_one_line_and_resumes(tmp_path, capfd):
    short = [f"train.output_dir={tmp_path}", "train.max_iter=5", "train.eval_period=0", "lr_multiplier.warmup_iters=0"]
    assert cli(short) == 0
    capfd.readouterr()
    assert cli([*short, "--resume", "train.max_iter=8", f"train.init_checkpoint={tmp_path / 'gone.pth'}"]) == 0
    out, err = capfd.readouterr()
    said = [line for line in (out + err).splitlines() if "train.init_checkpoint is" in line]
    assert len(said) == 1 and said[0].endswith(
        "WARNING: train.init_checkpoint is not loaded (--resume continues the run's checkpoint), and it could not "
        f"be: Checkpoint file '{tmp_path / 'gone.pth'}' does not exist."
    ), said
    assert torch.load(tmp_path / "model_final.pth", weights_only=True)["iteration"] == 7


def test_resume_with_an_init_checkpoint_that_is_no_checkpoint_says_so_in_one_line_and_resumes(tmp_path, capfd):
    # As a missing one is: a requeued job's train.init_checkpoint that is there, but a download's error page.
    short = [f"train.output_dir={tmp_path}", "train.max_iter=5", "train.eval_period=0", "lr_multiplier.warmup_iters=0"]
    assert cli(short) == 0
    capfd.readouterr()
    page = tmp_path / "R-50.pth"
    page.write_text("<html>404 Not Found</html>\n")
    assert cli([*short, "--resume", "train.max_iter=8", f"train.init_checkpoint={page}"]) == 0
    out, err = capfd.readouterr()
    said = [line for line in (out + err).splitlines() if "train.init_checkpoint is" in line]
    assert len(said) == 1 and said[0].split(" WARNING: ", 1)[1].startswith(
        "train.init_checkpoint is not loaded (--resume continues the run's checkpoint), and it could not be: "
        f"Cannot load checkpoint '{page}': it is corrupt or not a plain-data torch checkpoint (weights-only "
        "unpickling stopped at: "
    ), said
    assert torch.load(tmp_path / "model_final.pth", weights_only=True)["iteration"] == 7


def test_a_config_may_give_its_paths_as_pathlib_paths(tmp_path, monkeypatch):
    config = tmp_path / "paths.py"
    config.write_text(
        "import pathlib\n"
        "from treadle.config import LazyConfig\n"
        f"_all = LazyConfig.load({str(DIGITS)!r})\n"
        "model, optimizer, lr_multiplier, dataloader, train = (_all.model, _all.optimizer, _all.lr_multiplier, "
        "_all.dataloader, _all.train)\n"
        f"train.output_dir = pathlib.Path({str(tmp_path / 'second')!r})\n"
        f"train.init_checkpoint = pathlib.Path({str(tmp_path / 'first' / 'model_final.pth')!r})\n"
    )
    short = ["train.max_iter=3", "train.eval_period=0", "lr_multiplier.warmup_iters=0"]
    assert cli([f"train.output_dir={tmp_path / 'first'}", *short]) == 0
    assert cli(["--config-file", str(config), *short]) == 0
    assert (tmp_path / "second" / "model_final.pth").is_file()
    assert f"Loaded all 6 model keys from {tmp_path / 'first' / 'model_final.pth'}" in (
        tmp_path / "second" / "log.txt").read_text()


def test_research_loop_config_replaces_the_step(tmp_path):
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_sam.py"))
    cfg = LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path}", "train.max_iter=60", "train.eval_period=0", "lr_multiplier.warmup_iters=5"])
    from treadle.engine.defaults import DefaultTrainer, default_setup
    from treadle.examples import SAMStep

    default_setup(cfg)
    trainer = DefaultTrainer(cfg)
    assert isinstance(trainer.step, SAMStep)
    results = trainer.train()
    assert results["accuracy"] > 0.5
    assert {"total_loss", "loss_perturbed"} <= set(trainer.storage.latest())


CONFIGS = sorted((ROOT / "configs").glob("*.py"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_runs_shorter_than_its_warmup(config, tmp_path, treadle_caplog):
    """train.max_iter=30 with the presets' 50 warm-up iterations: clipped with one warning, then the whole job runs."""
    out = tmp_path / "run"
    code = cli(["--config-file", str(config), f"train.output_dir={out}", "train.max_iter=30"])
    assert code == 0, treadle_caplog.text[-3000:]
    final = torch.load(out / "model_final.pth", weights_only=True)
    assert final["iteration"] == 29 and final["model"]
    clipped = [r.getMessage() for r in treadle_caplog.records if "warmup_iters" in r.getMessage()]
    assert clipped == [
        "lr_multiplier.warmup_iters=50 is not shorter than the run (max_iter=30): warming up over 15 iterations, "
        "half the run, instead."
    ]
    assert [r.levelname for r in treadle_caplog.records if "warmup_iters" in r.getMessage()] == ["WARNING"]
    # The evaluation after training ran too (the configs' eval_period is longer than the run).
    assert [line["iteration"] for line in metrics(out) if "total_loss" not in line] == [30]


def test_config_evaluator_with_a_torchmetrics_metric(tmp_path, capsys):
    """A torchmetrics object in the config's metrics: built once the run is
    built, its result name checked against the best checkpointer's metric."""
    config = tmp_path / "tm.py"
    config.write_text(
        "from torchmetrics.classification import MulticlassAccuracy\n"
        "from treadle.config import LazyCall as L, LazyConfig\n"
        f"_base = LazyConfig.load({str(DIGITS)!r})\n"
        "model, optimizer, lr_multiplier, dataloader, train = _base.model, _base.optimizer, _base.lr_multiplier, "
        "_base.dataloader, _base.train\n"
        "dataloader.evaluator.metrics = ['accuracy', 'loss', L(MulticlassAccuracy)(num_classes=10, average='micro')]\n"
        "train.best_checkpointer.metric = 'multiclass_accuracy'\n"
    )
    out = tmp_path / "run"
    common = ["--config-file", str(config), f"train.output_dir={out}", "train.max_iter=40", "train.eval_period=20",
              "lr_multiplier.warmup_iters=5"]
    assert cli(common) == 0
    lines = metrics(out)
    evaluations = [line for line in lines if "accuracy" in line]
    assert all(line["multiclass_accuracy"] == pytest.approx(line["accuracy"]) for line in evaluations)
    assert (out / "model_best.pth").exists()
    assert cli(common[:2] + [f"train.output_dir={tmp_path / 'other'}", "train.best_checkpointer.metric=multiclass_acc"]) == 2
    assert "train.best_checkpointer.metric='multiclass_acc' is not a result" in capsys.readouterr().err


def test_an_unknown_train_key_is_warned_about_once(tmp_path):
    """train_net checks a job before it starts its processes and again in each;
    on one process the console showed the warning twice."""
    out = tmp_path / "run"
    result = run_job("--config-file", str(DIGITS), "+train.new_key=1", "train.max_iter=2", "train.eval_period=0",
                     f"train.output_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("train.new_key is not a key that DefaultTrainer reads") == 1
    # In log.txt once: the check that printed it ran before the job set up its log file.
    assert (out / "log.txt").read_text().count("train.new_key is not a key that DefaultTrainer reads") == 1


def test_an_override_that_does_not_parse_is_warned_about_once(tmp_path):
    # The override is parsed by both checks of the job; the console and
    # log.txt said it twice.
    out = tmp_path / "run"
    result = run_job("--config-file", str(DIGITS), "+train.new_key=[1,", "train.max_iter=2", "train.eval_period=0",
                     f"train.output_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    warning = "Override value '[1,' does not parse"
    assert result.stdout.count(warning) == 1, result.stdout
    log = (out / "log.txt").read_text().splitlines()
    assert [line for line in log if warning in line] == log[:1]


def test_a_second_job_in_one_process_warns_about_its_config_again(tmp_path, capsys):
    # A notebook that runs two jobs with the same unknown key: the second was
    # silent (the key had been warned about once per process).
    for run in ("first", "second"):
        code = cli(["--config-file", str(DIGITS), "+train.new_key=1", "train.max_iter=2", "train.eval_period=0",
                    f"train.output_dir={tmp_path / run}"])
        assert code == 0
        assert capsys.readouterr().out.count("train.new_key is not a key that DefaultTrainer reads") == 1, run
        assert (tmp_path / run / "log.txt").read_text().count("train.new_key is not a key that DefaultTrainer reads") == 1


def _used_folder(path):
    """A folder holding an earlier run: what a finished run leaves that marks it as one."""
    path.mkdir()
    (path / "metrics.json").write_text('{"iteration": 39, "total_loss": 0.5}\n')
    (path / "last_checkpoint").write_text("model_final.pth")
    torch.save({"model": {"w": torch.ones(2)}, "iteration": 39}, path / "model_final.pth")
    (path / "log.txt").write_text("the earlier run's log\n")
    return path


def _first_lines(*args):
    """The job's exit status and its console, stdout and stderr as one stream, in order."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, str(TRAIN_NET), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, cwd=ROOT, env=env,
    )
    return result.returncode, [line for line in result.stdout.splitlines() if line.strip()]


def test_a_used_folder_is_refused_before_the_environment_and_model_are_printed(tmp_path):
    from tests.run_files import snapshot

    out = _used_folder(tmp_path / "run")
    before = snapshot(out)
    code, lines = _first_lines(f"train.output_dir={out}", "train.max_iter=5")
    assert code == 2
    # The refusal is the job's first and only line: no environment table, config or model first.
    assert len(lines) == 1, "\n".join(lines[:40])
    assert lines[0].startswith("train_net.py: error: ") and f"'{out}' holds an earlier run" in lines[0], lines[0]
    assert snapshot(out) == before and sorted(os.listdir(out)) == sorted(before)  # not even a lock file


def test_under_torchrun_a_used_folder_is_refused_once_not_once_per_process(tmp_path):
    from tests.run_files import snapshot

    out = _used_folder(tmp_path / "run")
    before = snapshot(out)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAIN_NET),
         f"train.output_dir={out}", "train.max_iter=5"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines() if f"'{out}' holds an earlier run" in line]
    assert len(refusals) == 1, result.stderr[-3000:]
    assert snapshot(out) == before


def test_a_busy_folder_is_refused_before_anything_is_printed_also_on_resume(tmp_path):
    from tests.run_files import snapshot
    from treadle.utils.run_folder import RunFolder

    out = _used_folder(tmp_path / "run")
    with RunFolder(str(out)):  # another job, here: this process holds the folder
        before = snapshot(out)
        code, lines = _first_lines(f"train.output_dir={out}", "train.max_iter=5", "--resume")
        assert snapshot(out) == before  # the holder's lock file too
    assert code == 2
    assert len(lines) == 1, "\n".join(lines[:40])
    assert f"'{out}' is in use by another job: PID {os.getpid()}" in lines[0], lines[0]



def test_sam_ends_its_update_as_every_step_does_clipping_by_value_included():
    """SAMStep copied the clipping and the optimizer step, and ignored clip_grad_value."""
    import torch
    from torch import nn

    from treadle.engine import TrainerBase
    from treadle.examples import SAMStep

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    before = [p.detach().clone() for p in model.parameters()]
    batches = [(torch.randn(16, 4) * 100, torch.randint(0, 2, (16,))) for _ in range(2)]
    step = SAMStep(model, batches, torch.optim.SGD(model.parameters(), lr=1.0), loss_fn=nn.functional.cross_entropy,
                   clip_grad_value=1e-4)
    TrainerBase(step).train(0, 2)
    # Each element's gradient is clamped to 1e-4, so two updates at lr 1 move it by 2e-4 at most.
    assert max(float((p.detach() - q).abs().max()) for p, q in zip(model.parameters(), before)) <= 2e-4 + 1e-7


class CriterionStep(StepBase):
    """A research step that computes its loss with its own criterion: it takes no loss_fn."""

    def __init__(self, model, data_loader, optimizer, *, criterion) -> None:
        self.model, self.criterion = model, criterion
        self.data = DataStream(data_loader)
        self.update = Update(optimizer, model=model)

    def run_step(self) -> None:
        inputs, targets = next(self.data)
        loss = self.criterion(self.model(inputs), targets)
        self.update.apply(loss)
        self.storage.put_scalar("total_loss", loss.detach(), kind=ScalarKind.LOSS)


def _research_step_job(tmp_path, *evaluator):
    """digits_sam.py with train.step a CriterionStep, evaluated after its 4 iterations."""
    config = tmp_path / "research.py"
    config.write_text(
        "import torch\nfrom treadle.config import LazyCall as L, LazyConfig\n"
        "from tests.tools.test_train_net import CriterionStep\n"
        f"_base = LazyConfig.load({str(ROOT / 'configs' / 'digits_sam.py')!r})\n"
        "model, optimizer, lr_multiplier, dataloader, train = _base.model, _base.optimizer, _base.lr_multiplier, "
        "_base.dataloader, _base.train\n"
        "train.step = L(CriterionStep)(criterion=L(torch.nn.CrossEntropyLoss)())\n"
    )
    out = tmp_path / "run"
    code = cli(["--config-file", str(config), f"train.output_dir={out}", "train.max_iter=4", "train.eval_period=0",
                "lr_multiplier.warmup_iters=1", *evaluator])
    return code, out


def test_a_research_step_without_loss_fn_is_evaluated_with_the_evaluators(tmp_path):
    """The step takes no loss_fn; the evaluation feeds the model as the evaluator's loss_fn needs."""
    code, out = _research_step_job(tmp_path)
    assert code == 0
    evaluations = [line for line in metrics(out) if "accuracy" in line]
    assert [line["iteration"] for line in evaluations] == [4]
    assert 0 < evaluations[0]["loss"] < 10


def test_a_research_step_and_an_evaluator_without_loss_fn_are_refused_before_anything_is_written(tmp_path, capsys):
    code, out = _research_step_job(tmp_path, "dataloader.evaluator.loss_fn=None")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].split(": error: ", 1)[1] == (
        "dataloader.evaluator computes 'loss' and has no loss_fn, and train.step (CriterionStep) computes its loss "
        "its own way: set dataloader.evaluator.loss_fn (e.g. L(torch.nn.CrossEntropyLoss)())"
    )
    assert not out.exists()


def test_libai_graph_enabled_trains_with_the_compiled_step(tmp_path, capsys):
    """LiBai's ``graph = dict(enabled=True)`` in config.py: CompiledStep, said in one line."""
    config = tmp_path / "graph.py"
    config.write_text(
        f"from treadle.config import LazyConfig\n_base = LazyConfig.load({str(DIGITS)!r})\n"
        "model, optimizer, lr_multiplier, dataloader, train = _base.model, _base.optimizer, _base.lr_multiplier, "
        "_base.dataloader, _base.train\n"
        "graph = dict(enabled=True)\n"
    )
    out = tmp_path / "run"
    assert cli(["--config-file", str(config), f"train.output_dir={out}", "train.max_iter=3", "train.eval_period=0",
                "lr_multiplier.warmup_iters=1", "train.step.compile.backend=aot_eager"]) == 0
    line = "graph.enabled=True (LiBai's graph mode): training with CompiledStep, as train.step.kind='compiled'"
    assert line in capsys.readouterr().out and line in (out / "log.txt").read_text()
    assert torch.load(out / "model_final.pth", weights_only=True)["iteration"] == 2


def test_a_top_level_node_no_code_reads_is_refused_before_anything_is_written(tmp_path, capsys):
    config = tmp_path / "extra.py"
    config.write_text(
        f"from treadle.config import LazyConfig\n_base = LazyConfig.load({str(DIGITS)!r})\n"
        "model, optimizer, lr_multiplier, dataloader, train = _base.model, _base.optimizer, _base.lr_multiplier, "
        "_base.dataloader, _base.train\n"
        "tokenization = dict(tokenizer='bert')\n"
    )
    out = tmp_path / "run"
    assert cli(["--config-file", str(config), f"train.output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "The config's top-level node 'tokenization' is read by nothing" in err[0]
    assert not out.exists()


# ---------------------------------------------------------------- the deferred flush after faults
DEFERRED = ROOT / "tests" / "deferred_train_net.py"
FAULTS_CONFIG = ROOT / "tests" / "dist_scripts" / "digits_faults.py"
# A flush every 5 iterations falls on each evaluation (49, 99), where the best
# checkpoint reads the result from the storage; checkpoints at 29, 59, 89.
EVALUATED = ["train.max_iter=120", "train.log_period=5", "train.eval_period=50", "train.checkpointer.period=30",
             "model.rank=0"]


def _faulty_job(script, out, *faults):
    return subprocess.Popen(
        [sys.executable, str(script), "--config-file", str(FAULTS_CONFIG), f"train.output_dir={out}", *EVALUATED, *faults],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _tensorboard_scalars(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _assert_same_rows(run_dir, reference):
    """metrics.json and TensorBoard hold the reference's rows, key for key and
    value for value (timings by key only: they differ between runs)."""
    rows, expected = metrics(run_dir), metrics(reference)
    assert [sorted(row) for row in rows] == [sorted(row) for row in expected]
    timeless = lambda lines: [{k: v for k, v in row.items() if not k.endswith("time")} for row in lines]  # noqa: E731
    assert timeless(rows) == timeless(expected)
    board, expected_board = _tensorboard_scalars(run_dir), _tensorboard_scalars(reference)
    assert board.keys() == expected_board.keys()
    for tag, points in expected_board.items():
        assert [step for step, _ in board[tag]] == [step for step, _ in points], tag
        if not tag.endswith("time"):
            assert board[tag] == points, tag
    for it in (49, 99):  # the evaluations' rows hold the training values too
        row = next(row for row in rows if row["iteration"] == it)
        assert {"accuracy", "lr", "total_loss", "time", "data_time"} <= set(row), row


@pytest.mark.slow
def test_the_deferred_flush_writes_whole_rows_through_train_net_after_kill_9_and_sigterm(tmp_path):
    reference = tmp_path / "reference"
    waiting = _faulty_job(TRAIN_NET, reference)
    assert waiting.wait(timeout=300) == 0, waiting.stderr.read()[-2000:]

    # kill -9 in iteration 55: the run resumes from 29 and writes 30.. again.
    killed, marker = tmp_path / "killed", tmp_path / "paused"
    job = _faulty_job(DEFERRED, killed, "model.pause_at_iter=55", f"model.pause_marker={marker}")
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), job.stderr.read()[-2000:] if job.poll() is not None else "timed out"
    finally:
        job.kill()
        job.wait()
    resumed = _faulty_job(DEFERRED, killed, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()[-2000:]
    _assert_same_rows(killed, reference)

    # SIGTERM in iteration 49, an evaluation's and a flush's: the job saves it and exits 75.
    stopped = tmp_path / "stopped"
    job = _faulty_job(DEFERRED, stopped, "model.signal_at_iter=49")
    assert job.wait(timeout=300) == 75, job.stderr.read()[-2000:]
    assert (stopped / "last_checkpoint").read_text() == "model_0000049.pth"
    resumed = _faulty_job(DEFERRED, stopped, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()[-2000:]
    _assert_same_rows(stopped, reference)


def test_the_jobs_log_counts_iterations_one_way_and_metrics_json_keeps_detectron2s_rows(tmp_path):
    """eval_period=3, max_iter=6: log.txt says 'after 3 iterations' and 'after 6 iterations' (both lines);
    metrics.json keeps the rows at 2 and 6 (max_iter), and summary.json's last_iter is 5."""
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", "train.max_iter=6", "train.eval_period=3", "train.log_period=1",
                "train.checkpointer.period=0", "lr_multiplier.warmup_iters=1"]) == 0
    rows = [(line["iteration"], line["accuracy"]) for line in metrics(out) if "accuracy" in line]
    assert [it for it, _ in rows] == [2, 6]
    log = (out / "log.txt").read_text()
    said = [line.split(" INFO: ", 1)[1] for line in log.splitlines() if " INFO: Evaluation after" in line
            or " INFO: metrics after" in line]
    assert [text.split(":")[0] for text in said] == [
        "Evaluation after 3 iterations", "metrics after 3 iterations", "Evaluation after 6 iterations", "metrics after 6 iterations",
    ]
    assert f"accuracy={rows[-1][1]:.6g}" in said[2] and f"accuracy: {rows[-1][1]:.6g}" in said[3]
    assert json.loads((out / "summary.json").read_text())["last_iter"] == 5
    assert "after iteration" not in log and "@ iter" not in log

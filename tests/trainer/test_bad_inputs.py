"""The plain Trainer's bad inputs: each is one line naming the setting, option
or file, before anything is written; paths are taken as ``str`` or
``os.PathLike`` everywhere."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torch import nn

from treadle.checkpoint import CheckpointError, Checkpointer
from treadle.trainer import Trainer

from tests.run_files import snapshot

CE = nn.functional.cross_entropy


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))


def batches(n=4):
    g = torch.Generator().manual_seed(1)
    # Ready batches, read once per epoch (a list given as it is would be a dataset of samples).
    return DataLoader([(torch.randn(4, 6, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)],
                      batch_size=None)


def trainer(optimizer="sgd", **settings):
    model = mlp()
    settings.setdefault("max_iter", 4)
    return Trainer(model, optimizer, settings.pop("train_loader", batches()), lr=0.1, loss_fn=CE, progress_bar=False,
                   **settings)


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------- empty data
@pytest.mark.parametrize("name", ["train_loader", "eval_loader"])
def test_empty_data_is_refused_when_the_trainer_is_built_before_anything_is_written(name, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=rf"^{name} is empty \(a list of length 0\)"):
        trainer(output_dir=str(out), **{name: []})
    assert not out.exists()


# ---------------------------------------------------------------------- paths
def test_every_path_is_taken_as_a_str_or_a_pathlike(tmp_path):
    first = trainer(output_dir=tmp_path / "first", checkpoints_dir=Path("ckpt"), logs_dir=Path("logs"))
    first.train()
    assert (tmp_path / "first" / "ckpt" / "model_final.pth").is_file()
    assert (tmp_path / "first" / "logs" / "metrics.json").is_file() and (tmp_path / "first" / "logs" / "log.txt").is_file()
    assert first.save_checkpoint(tmp_path / "saved.pth") == str(tmp_path / "saved.pth")
    weights = torch.load(tmp_path / "saved.pth", weights_only=True)["model"]

    loaded = trainer()
    loaded.load_checkpoint(tmp_path / "saved.pth")
    assert same_weights(loaded.model.state_dict(), weights)
    initialized = trainer(init_weights_from=tmp_path / "saved.pth", max_iter=1)
    assert same_weights(initialized.model.state_dict(), weights)
    resumed = trainer(output_dir=tmp_path / "resumed", max_iter=6)
    resumed.train(resume=tmp_path / "saved.pth")
    assert resumed.last_run_iter == 5 and (tmp_path / "resumed" / "model_final.pth").is_file()

    by_checkpointer = Checkpointer(mlp(1), tmp_path / "first" / "ckpt")
    assert by_checkpointer.has_checkpoint()
    by_checkpointer.load(tmp_path / "saved.pth")
    assert same_weights(by_checkpointer.model.state_dict(), weights)


def test_a_path_setting_of_another_type_is_refused_naming_its_type(tmp_path):
    with pytest.raises(ValueError, match=r"^output_dir must be a non-empty path \(a str or os.PathLike\) or None, "
                                         r"got int 5$"):
        trainer(output_dir=5)


@pytest.mark.parametrize("method", ["save_checkpoint", "load_checkpoint"])
def test_a_checkpoint_path_given_as_bytes_is_refused_naming_its_type_and_touches_nothing(method, tmp_path):
    # pytorch-accelerated's trainer.save_checkpoint(save_path) / qurious' trainer.load_checkpoint(path), the path
    # as bytes (os.fsencode, a bytes glob): refused as every path setting is, before any file is touched.
    first = trainer()
    first.save_checkpoint(str(tmp_path / "saved.pth"))
    before, weights = snapshot(tmp_path), {k: v.clone() for k, v in first.model.state_dict().items()}
    name = b"saved.pth" if method == "load_checkpoint" else b"new.pth"
    path = os.fsencode(tmp_path) + b"/" + name
    message = f"{method}'s path must be a non-empty path (a str or os.PathLike), got bytes {path!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        getattr(first, method)(path)
    assert snapshot(tmp_path) == before and same_weights(first.model.state_dict(), weights)


def test_a_raw_pickle_checkpoint_is_refused_in_one_line_without_torchs_warning(tmp_path):
    # qurious' trainer.load_checkpoint(path) on weights saved with pickle.dump, not torch.save.
    import pickle
    import warnings

    t = trainer()
    weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    raw = tmp_path / "weights.pkl"
    with open(raw, "wb") as f:
        pickle.dump({"model": mlp(1).state_dict()}, f, protocol=4)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError) as refused:
            t.load_checkpoint(str(raw))
    assert [str(w.message) for w in warned] == []
    message = str(refused.value)
    assert message.startswith(f"Cannot load checkpoint '{raw}': it is corrupt or not a plain-data torch checkpoint "
                              "(weights-only unpickling stopped at: Unsupported operand ") and "\n" not in message
    assert same_weights(t.model.state_dict(), weights)


@pytest.mark.parametrize(
    "setting, value, where",
    [
        ("checkpoints_dir", "../elsewhere", "is outside output_dir"),
        ("checkpoints_dir", "a/../..", "is outside output_dir"),
        ("logs_dir", "/tmp/logs", "is outside output_dir"),
        ("logs_dir", Path("."), "is output_dir itself"),
        ("checkpoints_dir", "sub/..", "is output_dir itself"),
    ],
)
def test_a_run_subfolder_outside_output_dir_or_equal_to_it_is_refused(setting, value, where, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=rf"^{setting}='{value}' {where}: give a folder inside output_dir"):
        trainer(output_dir=str(out), **{setting: value})
    assert not out.exists() and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(
    "setting, value, blocker",
    [
        ("checkpoints_dir", "checkpoints", "checkpoints"),
        ("logs_dir", "logs", "logs"),
        ("logs_dir", "logs/tensorboard", "logs"),
    ],
)
def test_a_run_subfolder_that_is_a_file_is_refused_before_anything_is_written(setting, value, blocker, tmp_path):
    # Hezar's layout, where output_dir already holds a file of the subfolder's name.
    out = tmp_path / "run"
    out.mkdir()
    (out / blocker).write_text("notes\n")
    before = snapshot(out)
    what = "it is" if value == blocker else f"'{out / blocker}' is"
    message = f"{setting} '{out / value}' cannot be written: {what} a file, not a directory; give another {setting}"
    with pytest.raises(PermissionError, match=f"^{re.escape(message)}$"):
        trainer(output_dir=str(out), **{setting: value})
    assert snapshot(out) == before


def test_init_weights_from_a_run_folder_is_refused_naming_its_last_checkpoint_as_load_checkpoint_does(tmp_path):
    # Hezar's init_weights_from, "a model from disk", given the folder of an earlier run.
    first = tmp_path / "first"
    trainer(output_dir=str(first)).train()
    before = snapshot(first)
    message = (f"'{first}' is a run folder, not a checkpoint file: give the checkpoint file inside it "
               f"('{first / 'model_final.pth'}' is its last), or resume the run from its folder (resume=True with it "
               "as the output folder)")
    with pytest.raises(CheckpointError) as refused:
        trainer(output_dir=str(tmp_path / "second"), init_weights_from=str(first))
    assert str(refused.value) == f"init_weights_from='{first}': " + message
    with pytest.raises(CheckpointError) as by_load_checkpoint:
        trainer().load_checkpoint(str(first))
    assert str(by_load_checkpoint.value) == message
    assert snapshot(first) == before and not (tmp_path / "second").exists()


# ---------------------------------------------------------------------- options torch refuses
@pytest.mark.parametrize(
    "optimizer, culprit",
    [
        (("adam", {"betas": "x"}), "optimizer='adam': torch.optim.Adam refuses betas='x' (TypeError: "),
        (("sgd", {"momentum": "fast"}), "optimizer='sgd': torch.optim.SGD refuses momentum='fast' (TypeError: "),
        (("adamw", {"eps": -1.0}), "optimizer='adamw': torch.optim.AdamW refuses eps=-1.0 (ValueError: "),
    ],
)
def test_an_optimizer_option_torch_refuses_is_one_line_naming_the_optimizer_and_option(optimizer, culprit, tmp_path):
    with pytest.raises(ValueError) as error:
        trainer(optimizer, output_dir=str(tmp_path / "run"))
    assert str(error.value).startswith(culprit) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "settings, culprit",
    [
        ({"scheduler": ("step", {"gamma": "x"})}, "scheduler='step': option gamma must be a number, got 'x'"),
        ({"scheduler": ("step", {"steps": "x"})}, "scheduler='step': option steps must be a list of iterations, got 'x'"),
        ({"scheduler": ("cosine", {"end_value": "x"})}, "scheduler='cosine': option end_value must be a number, got 'x'"),
        ({"compile": {"mode": "fastest"}}, "compile['mode'] must be one of None, 'default'"),
        ({"compile": {"bogus": 1}}, "compile has no option 'bogus'; its options are backend, dynamic, fullgraph, mode, "
                                    "options"),
        ({"compile": {"backend": "nope"}}, "compile['backend']='nope' is not a torch.compile backend; choose one of "),
        ({"compile": {"mode": "default", "options": {}}}, "compile: torch.compile takes either mode or options"),
        ({"ddp": {"kind": "ddp", "bucket_cap_mb": "x"}}, "ddp['bucket_cap_mb'] must be a positive number or None, got 'x'"),
        ({"ddp": {"kind": "fsdp", "fullgraph": True}}, "ddp has no option 'fullgraph'; its options are "),
    ],
)
def test_a_scheduler_compile_or_ddp_option_torch_refuses_is_one_line_naming_it(settings, culprit, tmp_path):
    with pytest.raises(ValueError) as error:
        trainer(output_dir=str(tmp_path / "run"), **settings)
    assert str(error.value).startswith(culprit) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- a resume that does not fit
def test_resuming_an_optimizer_with_other_parameter_groups_is_one_line_naming_the_file_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    # weight_decay puts norms and biases into a group of their own: two groups, then one.
    trainer(output_dir=str(out), weight_decay=0.01).train()
    before = snapshot(out)
    other = trainer(output_dir=str(out), weight_decay=0.0, max_iter=8)
    untouched = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(CheckpointError) as error:
        other.train(resume=True)
    message = str(error.value)
    assert message.startswith(f"Cannot resume from {out / 'model_final.pth'}: The optimizer state ('optimizer') in "
                              f"'{out / 'model_final.pth'}' has 2 parameter group(s) of [2, 2] parameters, and this "
                              "run's optimizer 1 of [4]"), message
    assert "\n" not in message
    assert snapshot(out) == before
    assert same_weights(other.model.state_dict(), untouched)  # refused before the weights were loaded
    with pytest.raises(CheckpointError, match=r"^The optimizer state \('optimizer'\) in '.*model_final.pth' has 2"):
        other.load_checkpoint(out / "model_final.pth")


# ---------------------------------------------------------------------- what a seed's user writes by mistake
@pytest.mark.parametrize("name", ["train_loader", "eval_loader"])
@pytest.mark.parametrize("path", ["data/test.csv", b"data/test.csv"], ids=["str", "bytes"])
def test_a_path_given_as_data_is_refused_naming_the_setting_before_anything_is_written(name, path, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TypeError) as raised:
        trainer(output_dir=str(out), batch_size=4, **{name: path})
    assert str(raised.value) == (
        f"{name}={path!r} is a {type(path).__name__}, not data: give a dataset (a torch Dataset, a list of samples) "
        "or batches (a DataLoader); a file is read into a Dataset first")
    assert not out.exists()


def test_a_loss_class_is_refused_with_the_instance_to_give(tmp_path):
    # qurious' Trainer(model, optimizer, loss_fn): the class where an instance goes.
    out = tmp_path / "run"
    with pytest.raises(ValueError) as raised:
        Trainer(mlp(), "sgd", batches(), lr=0.1, loss_fn=nn.CrossEntropyLoss, max_iter=4, output_dir=str(out))
    assert str(raised.value) == "loss_fn=nn.CrossEntropyLoss is a class: give an instance, loss_fn=nn.CrossEntropyLoss()"
    assert not out.exists()


def test_a_class_given_for_an_instance_is_refused_for_the_optimizer_and_a_metric():
    with pytest.raises(TypeError) as raised:
        trainer(optimizer=torch.optim.Adam)
    assert str(raised.value) == ("optimizer=Adam is a class: give an instance, torch.optim.Adam(model.parameters(), "
                                 "lr=...), or a name with lr= ('sgd', 'adam', 'adamw')")

    class Accuracy(nn.Module):  # a torchmetrics-like class
        pass

    with pytest.raises(ValueError) as raised:
        trainer(metrics=[Accuracy], eval_loader=batches(1))
    assert str(raised.value) == "metrics: Accuracy is a class: give an instance, metrics=[Accuracy(...)]"


def test_a_torch_scheduler_class_is_refused_rather_than_given_the_run_length_as_its_step_size(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError) as raised:
        trainer(scheduler=torch.optim.lr_scheduler.StepLR, output_dir=str(out))
    assert str(raised.value) == (
        "scheduler=StepLR is a class, which would be called as StepLR(optimizer, max_iter) and make step_size the "
        "run's length: give functools.partial(StepLR, step_size=...) or StepLR(optimizer, step_size=...)")
    assert not out.exists()


def test_the_scheduler_factories_documented_still_build_their_schedules():
    import functools

    partial = trainer(scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5))
    lrs = []
    partial.register_hooks([_LrRecorder(lrs)])
    partial.train()
    assert lrs == [0.1, 0.1, 0.05, 0.05]  # StepLR(step_size=2, gamma=0.5), stepped each iteration
    # A class needing only the optimizer is a factory of it, with torch's defaults.
    assert trainer(scheduler=torch.optim.lr_scheduler.ConstantLR).train() is not None


class _LrRecorder(__import__("treadle.hooks", fromlist=["HookBase"]).HookBase):
    def __init__(self, lrs):
        self.lrs = lrs

    def before_step(self):
        self.lrs.append(self.trainer.optimizer.param_groups[0]["lr"])


def test_a_hugging_face_compute_metrics_function_is_refused_saying_what_metrics_takes():
    def compute_metrics(eval_pred):  # the Hugging Face Trainer's
        return {"accuracy": 1.0}

    with pytest.raises(ValueError) as raised:
        trainer(metrics=compute_metrics, eval_loader=batches(1))
    assert str(raised.value) == (
        "metrics=compute_metrics is a function, which treadle does not call (Hugging Face's "
        "compute_metrics(eval_pred)): give metric names (metrics=['accuracy', 'f1']), torchmetrics objects or "
        "DatasetEvaluators; a function of your own is registered as a metric (register_metric, docs/evaluation.md)")


def test_a_missing_init_weights_from_file_is_named_as_the_setting(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(CheckpointError) as raised:
        trainer(init_weights_from="nope.pth", output_dir=str(out))
    assert str(raised.value) == "init_weights_from='nope.pth': Checkpoint file 'nope.pth' does not exist."
    assert not out.exists()


# ---------------------------------------------------------------------- hooks of other frameworks
def test_a_hook_with_another_frameworks_stages_is_refused_when_the_trainer_is_built(tmp_path):
    """Before: MMEngine's before_train(self, runner) failed in train(), after log.txt and
    summary.json were written; its before_train_iter was never called, without a word."""
    from treadle.hooks import HookBase

    class RunnerHook(HookBase):
        def before_train(self, runner):
            pass

    class IterHook(HookBase):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            pass

    out = tmp_path / "run"
    with pytest.raises(TypeError) as refused:
        trainer(output_dir=str(out), hooks=[RunnerHook()])
    assert str(refused.value) == ("RunnerHook.before_train(runner) takes arguments, and the trainer calls "
                                  "before_train() with none: read the trainer as self.trainer, the rest from it "
                                  "(docs/engine.md)")
    with pytest.raises(TypeError, match=r"^IterHook\.before_train_iter is not a hook stage, so the trainer would "
                                        r"never call it: override before_step \(the stages: before_train, "):
        trainer(output_dir=str(out), hooks=[IterHook()])
    assert not out.exists()


def test_callback_events_are_taken_on_the_hooks_given_and_refused_on_a_hook_registered_later():
    from treadle.hooks import HookBase

    class EpochEnds(HookBase):
        def __init__(self):
            self.seen = []

        def on_train_epoch_end(self, trainer, **kwargs):
            self.seen.append(trainer.iter)

    given = EpochEnds()
    t = trainer(hooks=[given], max_epochs=2, max_iter=None)
    with pytest.raises(TypeError, match=r"^EpochEnds\.on_train_epoch_end is not a hook stage, so the trainer would "
                                        r"never call it: override after_epoch \("):
        t.register_hooks([EpochEnds()])  # the Trainer calls the events of the hooks it was built with only
    t.train()
    assert given.seen == [3, 7]


# ---------------------------------------------------------------------- settings and copies after build
def test_settings_replaced_after_the_trainer_is_built_are_refused_saying_to_build_a_new_one(tmp_path):
    import dataclasses

    out = tmp_path / "run"
    t = trainer(output_dir=str(out))
    built = t.settings
    with pytest.raises(AttributeError) as refused:
        t.settings = dataclasses.replace(built, logging=dataclasses.replace(built.logging, log_period=1))
    assert str(refused.value) == (
        "trainer.settings cannot be replaced once the Trainer is built: its hooks, writers, step and loaders were "
        "built from the settings it was given and would never read log_period=1; build a new Trainer with "
        "log_period=1 (Trainer(model, optimizer, train_loader, ..., log_period=1))"
    )
    with pytest.raises(AttributeError) as refused:
        t.settings = None
    assert str(refused.value) == (
        "trainer.settings cannot be replaced once the Trainer is built: its hooks, writers, step and loaders were "
        "built from the settings it was given and would never read None; build a new Trainer with the settings "
        "you want, as keyword arguments (Trainer(model, optimizer, train_loader, ..., log_period=...))"
    )
    assert t.settings is built and t.settings.logging.log_period == 20
    assert not out.exists()


@pytest.mark.parametrize("how, copy_of", [
    ("copied (copy.copy)", lambda t: __import__("copy").copy(t)),
    ("copied (copy.deepcopy)", lambda t: __import__("copy").deepcopy(t)),
    ("pickled", lambda t: __import__("pickle").loads(__import__("pickle").dumps(t))),
])
def test_a_copied_trainer_is_refused_in_one_line_before_anything_is_written(how, copy_of, tmp_path):
    """Before: the copy was accepted, and its train() wrote a summary saying "finished, 0
    iterations" before an internal AttributeError."""
    out = tmp_path / "run"
    t = trainer(output_dir=str(out))
    with pytest.raises(TypeError) as refused:
        copy_of(t)
    assert str(refused.value) == (
        f"A Trainer cannot be {how}: its hooks, step and checkpointer hold the Trainer they were built for, so a "
        "copy would not train; build another Trainer from the same arguments, and save or load its state with "
        "save_checkpoint(path) and load_checkpoint(path)"
    )
    assert not out.exists()
    t.train()  # the original still trains
    assert t.iter == 4


@pytest.mark.parametrize("name, value, treadles", [
    ("num_train_epochs", 2, "the Hugging Face Trainer's num_train_epochs is max_epochs here"),
    ("accumulate_grad_batches", 2, "Lightning's accumulate_grad_batches is grad_accum_steps here"),
    ("num_epochs", 2, "Hezar's, pytorch-accelerated's and qurious' num_epochs is max_epochs here"),
    ("learning_rate", 0.1, "Hezar's and the Hugging Face Trainer's learning_rate is lr here"),
    ("mixed_precision", "bf16", "Hezar's mixed_precision is precision here (Hezar's 'full' is 'fp32'; fp16 needs CUDA)"),
])
def test_another_trainers_setting_name_is_refused_naming_treadles(name, value, treadles, tmp_path):
    with pytest.raises(TypeError) as error:
        trainer(**{name: value}, output_dir=str(tmp_path / "run"))
    assert str(error.value) == f"Trainer.__init__() got an unexpected keyword argument {name!r}: {treadles}"
    assert not (tmp_path / "run").exists()


def test_every_setting_name_of_the_other_trainers_table_is_refused_naming_a_setting_of_treadles():
    from treadle.compat.names import SEED_SETTINGS
    from treadle.trainer.settings import SETTINGS

    ours = {row.name for row in SETTINGS} | {"model", "optimizer", "train_loader"}
    names = {part.split("=")[0] for s in SEED_SETTINGS for part in s.name.split(", ")}
    theirs = sorted(n for n in names if n.isidentifier() and n not in ours)
    assert {"per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "save_steps"} <= set(theirs)
    for name in theirs:
        with pytest.raises(TypeError) as error:
            trainer(**{name: 1})
        said = str(error.value).split(f"{name!r}: ", 1)[1]
        assert re.search(rf" {name} is (\w+) here", said).group(1) in ours | {"train_loader"}, said


def test_a_name_no_trainer_has_is_refused_as_python_says_it():
    with pytest.raises(TypeError) as error:
        trainer(max_epoch=2)
    assert str(error.value) == "Trainer.__init__() got an unexpected keyword argument 'max_epoch'"


def test_a_whole_float_for_an_integer_setting_is_that_integer(tmp_path):
    """batch_size=8.0 passed the rule (1e3 is an integer on a command line) and then failed as another setting
    ("total_batch_size must be an int, got float 8.0"); log_period=2.0 was taken as a float period."""
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(6, generator=g), i % 2) for i in range(32)]
    floats = trainer(train_loader=samples, batch_size=8.0, log_period=2.0, max_iter=4.0, seed=0,
                     output_dir=str(tmp_path / "a"))
    ints = trainer(train_loader=samples, batch_size=8, log_period=2, max_iter=4, seed=0,
                   output_dir=str(tmp_path / "b"))
    assert floats.settings.data.batch_size == 8 and type(floats.settings.data.batch_size) is int
    assert (floats.settings.logging.log_period, floats.max_iter) == (2, 4)
    floats.train()
    ints.train()
    for p, q in zip(floats.model.parameters(), ints.model.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="^batch_size must be an integer >= 1, got 8.5"):
        trainer(train_loader=samples, batch_size=8.5)

import json
import logging
import os
import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from treadle.events import EventStorage, NonFiniteLossError, ScalarKind
from treadle.events import printer as printer_module
from treadle.events import writers as writers_module
from treadle.utils import comm
from treadle.events.writers import (
    CommonMetricPrinter,
    CSVWriter,
    EventWriter,
    JSONWriter,
    TensorboardWriter,
    get_default_writers,
)


def put_training_scalars(s, it):
    """What a step, a timer and an LR hook put at one iteration."""
    s.put_scalar("total_loss", torch.tensor(float(it)), kind=ScalarKind.LOSS)
    s.put_scalar("loss_cls", torch.tensor(it * 0.5), kind=ScalarKind.LOSS)
    s.put_scalar("lr", 0.1)


def run_loop(writer, start, stop, *, write_every, eval_every=None, storage=None):
    """Iterations start..stop-1 with losses every iteration, an unsmoothed
    eval/acc = it/100 after iterations it with (it + 1) % eval_every == 0, and a
    write after iterations with (it + 1) % write_every == 0."""
    with (storage or EventStorage(start)) as s:
        for it in range(start, stop):
            s.iter = it
            put_training_scalars(s, it)
            if eval_every and (it + 1) % eval_every == 0:
                s.put_scalar("eval/acc", it / 100, smoothing_hint=False, kind=ScalarKind.METRIC)
            if (it + 1) % write_every == 0:
                writer.write()


def read_json_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ------------------------------------------------------------------ JSONWriter


def test_json_lines_hold_smoothed_training_scalars_and_every_evaluation(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path), window_size=4)
    writer.set_start_iter(0)
    run_loop(writer, 0, 40, write_every=20, eval_every=5)
    writer.close()

    text = path.read_text()
    assert text.splitlines()[:4] == [
        '{"iteration": 4, "eval/acc": 0.04}',
        '{"iteration": 9, "eval/acc": 0.09}',
        '{"iteration": 14, "eval/acc": 0.14}',
        # medians of the last 4 values: total_loss 16..19, loss_cls 8..9.5
        '{"iteration": 19, "eval/acc": 0.19, "loss_cls": 8.75, "lr": 0.1, "total_loss": 17.5}',
    ]
    records = read_json_lines(path)
    assert [r["iteration"] for r in records] == [4, 9, 14, 19, 24, 29, 34, 39]
    assert records[-1] == {"iteration": 39, "eval/acc": 0.39, "loss_cls": 18.75, "lr": 0.1, "total_loss": 37.5}
    assert text.endswith("\n")


def test_json_smoothed_scalar_goes_to_the_iteration_it_was_last_put_at(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path), window_size=2)
    with EventStorage(0) as s:
        for it in range(10):
            s.iter = it
            s.put_scalar("total_loss", float(it), kind=ScalarKind.LOSS)
            if it in (2, 6):
                s.put_scalar("grad_norm", float(it))
        writer.write()
    writer.close()
    assert read_json_lines(path) == [
        {"iteration": 6, "grad_norm": 6.0},  # the window is 2 iterations (5 and 6): the value put at 6 only
        {"iteration": 9, "total_loss": 8.5},
    ]


def test_json_never_writes_an_iteration_twice(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path), window_size=1)
    with EventStorage(0) as s:
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        writer.write()
        writer.write()  # nothing new: e.g. after_step, then after_train at the same iteration
        s.iter = 1
        s.put_scalar("total_loss", 2.0, kind=ScalarKind.LOSS)
        writer.write()
        writer.write()
    writer.close()
    assert path.read_text() == '{"iteration": 0, "total_loss": 1.0}\n{"iteration": 1, "total_loss": 2.0}\n'


def test_json_value_put_after_its_iteration_was_written_is_reported(tmp_path, caplog):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with EventStorage(0) as s:
        s.iter = 9
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        writer.write()
        s.put_scalar("eval/acc", 0.5, smoothing_hint=False, kind=ScalarKind.METRIC)  # too late for iteration 9
        with caplog.at_level(logging.WARNING, logger="treadle.events.writers"):
            writer.write()
    writer.close()
    assert read_json_lines(path) == [{"iteration": 9, "total_loss": 1.0}]
    assert "'eval/acc' was put at iteration 9 after that iteration was written" in caplog.text


def test_json_writes_non_finite_values_as_null(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with EventStorage(0) as s:
        s.put_scalar("grad_norm", float("inf"))
        s.put_scalar("eval/x", float("nan"), smoothing_hint=False)
        s.put_scalar("eval/y", float("-inf"), smoothing_hint=False)
        writer.write()
    writer.close()
    assert path.read_text() == '{"iteration": 0, "eval/x": null, "eval/y": null, "grad_norm": null}\n'


def test_json_lines_are_what_json_dumps_writes_for_awkward_names_and_numbers(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    values = {'say "hi"\\': 1e-05, "ünï/cödé": -0.0, "tab\tname": 1e300, "int_like": 3, "tiny": 5e-324}
    with EventStorage(7) as s:
        for name, value in values.items():
            s.put_scalar(name, value, smoothing_hint=False)
        writer.write()
    writer.close()
    expected = {"iteration": 7, **{name: float(values[name]) for name in sorted(values)}}
    assert path.read_text() == json.dumps(expected) + "\n"
    assert read_json_lines(path) == [expected]


def test_json_non_finite_loss_is_raised_then_written_by_the_next_write(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path), window_size=1)
    with EventStorage(0) as s:
        s.iter = 3
        s.put_scalar("total_loss", torch.tensor(float("nan")), kind=ScalarKind.LOSS)
        with pytest.raises(NonFiniteLossError, match="iteration 3"):
            writer.write()
        writer.write()  # what the writer hook's after_train does after the error
    writer.close()
    assert path.read_text() == '{"iteration": 3, "total_loss": null}\n'


def test_json_set_start_iter_drops_lines_of_the_interrupted_run(tmp_path, caplog):
    path = tmp_path / "metrics.json"
    # Odd spacing and key order: kept lines must stay byte-identical.
    before = '{"iteration":9,  "total_loss": 9.50}\n{"total_loss": 19.0, "iteration": 19}\n'
    path.write_text(
        before
        + '{"iteration": 29, "total_loss": 29.0}\n'
        + '{"iteration": 39, "total_lo'  # torn by a crash
    )
    writer = JSONWriter(str(path), window_size=1)
    with caplog.at_level(logging.WARNING, logger="treadle.events.writers"):
        writer.set_start_iter(20)
    assert "ends in an incomplete line" in caplog.text
    assert path.read_text() == before
    run_loop(writer, 20, 30, write_every=10)
    writer.close()
    assert path.read_text() == before + '{"iteration": 29, "loss_cls": 14.5, "lr": 0.1, "total_loss": 29.0}\n'
    assert os.listdir(tmp_path) == ["metrics.json"]  # no temporary file left behind


def test_json_set_start_iter_keeps_unknown_lines_and_a_complete_unterminated_one(tmp_path, caplog):
    path = tmp_path / "metrics.json"
    path.write_text('{"iteration": 1, "a": 1.0}\nnot json\n{"iteration": 2, "a": 2.0}')
    with caplog.at_level(logging.WARNING, logger="treadle.events.writers"):
        JSONWriter(str(path)).set_start_iter(5)
    assert f"{path}:2 is not a JSON object" in caplog.text
    assert path.read_text() == '{"iteration": 1, "a": 1.0}\nnot json\n{"iteration": 2, "a": 2.0}\n'


def test_json_set_start_iter_leaves_the_file_alone_when_nothing_is_dropped(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{"iteration": 1, "a": 1.0}\n')
    inode = os.stat(path).st_ino
    JSONWriter(str(path)).set_start_iter(2)
    assert os.stat(path).st_ino == inode


def test_json_set_start_iter_zero_empties_the_file_and_missing_file_is_fine(tmp_path):
    path = tmp_path / "metrics.json"
    JSONWriter(str(path)).set_start_iter(3)  # no file yet
    assert not path.exists()
    path.write_text('{"iteration": 0, "a": 1.0}\n')
    JSONWriter(str(path)).set_start_iter(0)
    assert path.read_text() == ""


def test_json_writer_reopens_after_close_and_creates_directories(tmp_path):
    path = tmp_path / "out" / "deep" / "metrics.json"
    writer = JSONWriter(str(path), window_size=1)
    with EventStorage(0) as s:
        s.put_scalar("a", 1.0)
        writer.write()
        writer.close()
        s.iter = 1
        s.put_scalar("a", 2.0)
        writer.write()
    writer.close()
    assert [r["iteration"] for r in read_json_lines(path)] == [0, 1]


def test_scalar_named_iteration_is_rejected(tmp_path):
    writer = JSONWriter(str(tmp_path / "m.json"))
    with EventStorage(0) as s:
        s.put_scalar("iteration", 1.0)
        with pytest.raises(ValueError, match="A scalar is named 'iteration'"):
            writer.write()


@pytest.mark.parametrize("window_size", [0, -1, 2.5, True])
def test_bad_window_size_is_rejected(tmp_path, window_size):
    with pytest.raises(ValueError, match="window_size must be a positive int"):
        JSONWriter(str(tmp_path / "m.json"), window_size=window_size)


def test_event_writer_is_abstract_and_a_context_manager(tmp_path):
    with pytest.raises(TypeError):
        EventWriter()
    path = tmp_path / "m.json"
    with JSONWriter(str(path)) as writer, EventStorage(0) as s:
        s.put_scalar("a", 1.0)
        writer.write()
    assert writer._file is None


# ------------------------------------------------------------------- CSVWriter


def test_csv_rows_and_a_header_widened_when_an_evaluation_appears(tmp_path):
    path = tmp_path / "metrics.csv"
    writer = CSVWriter(str(path), window_size=2)
    with EventStorage(0) as s:
        for it in range(20):
            s.iter = it
            s.put_scalar("total_loss", torch.tensor(float(it)), kind=ScalarKind.LOSS)
            if it >= 10:
                s.put_scalar("lr", 0.5)
            if it == 14:
                s.put_scalar("eval/acc", 0.75, smoothing_hint=False, kind=ScalarKind.METRIC)
            if (it + 1) % 10 == 0:
                writer.write()
    writer.close()
    assert path.read_text() == (
        "iteration,eval/acc,lr,total_loss\n"
        "9,,,8.5\n"
        "14,0.75,,\n"
        "19,,0.5,18.5\n"
    )
    assert os.listdir(tmp_path) == ["metrics.csv"]


def test_csv_non_finite_values_and_quoted_names(tmp_path):
    path = tmp_path / "metrics.csv"
    writer = CSVWriter(str(path))
    with EventStorage(0) as s:
        s.put_scalar("a,b", float("nan"))
        s.put_scalar("c", float("-inf"), smoothing_hint=False)
        writer.write()
    writer.close()
    assert path.read_text() == 'iteration,"a,b",c\n0,nan,-inf\n'


def test_csv_set_start_iter_drops_later_rows_and_a_torn_row_then_appends(tmp_path, caplog):
    path = tmp_path / "metrics.csv"
    kept = "iteration,lr,total_loss\n9,0.1,9.00\n"
    path.write_text(kept + "19,0.1,19.0\n29,0.1,2")
    writer = CSVWriter(str(path), window_size=1)
    with caplog.at_level(logging.WARNING, logger="treadle.events.writers"):
        writer.set_start_iter(10)
    assert "ends in an incomplete row" in caplog.text
    assert path.read_text() == kept
    run_loop(writer, 10, 20, write_every=10)
    writer.close()
    # loss_cls is new: the header widens and the old row gains an empty cell.
    assert path.read_text() == "iteration,loss_cls,lr,total_loss\n9,,0.1,9.00\n19,9.5,0.1,19.0\n"


def test_csv_refuses_a_file_that_is_not_its_own(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss\n1,2\n")
    with pytest.raises(ValueError, match="does not start with 'iteration'"):
        CSVWriter(str(path)).set_start_iter(0)


# ----------------------------------------------------------- TensorboardWriter


def load_events(log_dir):
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalar_points(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_scalars_images_and_histograms_read_back(tmp_path):
    writer = TensorboardWriter(str(tmp_path), window_size=4)
    writer.set_start_iter(0)
    with EventStorage(0) as s:
        for it in range(20):
            s.iter = it
            put_training_scalars(s, it)
            if (it + 1) % 5 == 0:
                s.put_scalar("eval/acc", it / 100, smoothing_hint=False, kind=ScalarKind.METRIC)
            if it == 7:
                s.put_image("sample", torch.zeros(3, 4, 6))
                s.put_histogram("weights", torch.arange(10.0))
            if (it + 1) % 10 == 0:
                writer.write()
                s.clear_images()  # the calling hook's job, after all writers ran
                s.clear_histograms()
    writer.close()

    acc = load_events(tmp_path)
    assert scalar_points(acc, "total_loss") == [(9, 7.5), (19, 17.5)]
    assert [step for step, _ in scalar_points(acc, "eval/acc")] == [4, 9, 14, 19]
    assert [v for _, v in scalar_points(acc, "eval/acc")] == pytest.approx([0.04, 0.09, 0.14, 0.19])
    (image,) = acc.Images("sample")
    assert (image.step, image.width, image.height) == (7, 6, 4)
    (hist,) = acc.Histograms("weights")
    assert hist.step == 7
    assert (hist.histogram_value.num, hist.histogram_value.min, hist.histogram_value.max) == (10, 0, 9)


def test_tensorboard_resume_purges_the_interrupted_runs_later_points(tmp_path):
    # Run 1 logs up to iteration 29 and is interrupted; its checkpoint is at 20.
    first = TensorboardWriter(str(tmp_path), window_size=1)
    first.set_start_iter(0)
    run_loop(first, 0, 30, write_every=10, eval_every=10)
    first.close()
    (first_file,) = os.listdir(tmp_path)
    # Make run 1's file sort first whatever the event-file counters are: it ran earlier.
    parts = first_file.split(".")
    parts[3] = "0000000001"
    os.rename(tmp_path / first_file, tmp_path / ".".join(parts))

    # Run 2 resumes at 20 with different values.
    second = TensorboardWriter(str(tmp_path), window_size=1)
    second.set_start_iter(20)
    with EventStorage(20) as s:
        for it in range(20, 40):
            s.iter = it
            s.put_scalar("total_loss", torch.tensor(1000.0 + it), kind=ScalarKind.LOSS)
            if (it + 1) % 10 == 0:
                s.put_scalar("eval/acc", 0.5, smoothing_hint=False, kind=ScalarKind.METRIC)
                second.write()
    second.close()

    acc = load_events(tmp_path)
    assert scalar_points(acc, "total_loss") == [(9, 9.0), (19, 19.0), (29, 1029.0), (39, 1039.0)]
    assert scalar_points(acc, "eval/acc") == [(9, pytest.approx(0.09)), (19, pytest.approx(0.19)), (29, 0.5), (39, 0.5)]
    assert [step for step, _ in scalar_points(acc, "loss_cls")] == [9, 19]  # run 1's 29 is hidden

    # What hides them: the second file starts with a SessionLog.START at step 20.
    second_file = sorted(os.listdir(tmp_path))[-1]
    starts = [
        e.step
        for e in EventFileLoader(str(tmp_path / second_file)).Load()
        if e.HasField("session_log") and e.session_log.status == e.session_log.START
    ]
    assert starts == [20]


def test_tensorboard_hands_scalars_over_in_batches_flush_secs_apart(tmp_path, monkeypatch):
    from treadle.events import tensorboard_writer

    now = [100.0]
    monkeypatch.setattr(tensorboard_writer.time, "monotonic", lambda: now[0])
    writer = TensorboardWriter(str(tmp_path), window_size=1, flush_secs=30)
    writer.set_start_iter(0)

    def on_disk():
        return [step for step, _ in scalar_points(load_events(tmp_path), "total_loss")]

    with EventStorage(0) as s:
        for it in range(4):
            s.iter = it
            s.put_scalar("total_loss", float(it), kind=ScalarKind.LOSS)
            writer.write()
            now[0] += 10  # written at 100, 110, 120, 130 s
            if it == 0:
                assert on_disk() == [0]  # the first batch goes at once
            if it == 2:
                assert on_disk() == [0]  # 20 s later: still kept
        assert on_disk() == [0, 1, 2, 3]  # 30 s after the first batch: the next one
        s.iter = 4
        s.put_scalar("total_loss", 4.0, kind=ScalarKind.LOSS)
        writer.write()
        assert on_disk() == [0, 1, 2, 3]
        writer.flush()  # what a checkpoint calls
        assert on_disk() == [0, 1, 2, 3, 4]
        s.iter = 5
        s.put_scalar("total_loss", 5.0, kind=ScalarKind.LOSS)
        writer.write()
    writer.close()  # close writes what is kept
    points = scalar_points(load_events(tmp_path), "total_loss")
    assert points == [(i, float(i)) for i in range(6)]


def test_tensorboard_writer_is_lazy_and_checks_its_arguments(tmp_path):
    log_dir = tmp_path / "tb"
    writer = TensorboardWriter(str(log_dir), flush_secs=5)
    with EventStorage(0):
        writer.write()  # nothing to write: no SummaryWriter, no file
    assert not log_dir.exists()
    with pytest.raises(TypeError, match="sets purge_step itself"):
        TensorboardWriter(str(log_dir), purge_step=3)
    with pytest.raises(TypeError, match=r"unknown SummaryWriter arguments \['flush_sec'\]"):
        TensorboardWriter(str(log_dir), flush_sec=5)


# --------------------------------------------------------- CommonMetricPrinter


def printed(caplog):
    # treadle_caplog's handler sits on "treadle" and, through propagation, on the
    # root logger: one record can arrive twice. One log call is one record object.
    records = {id(r): r for r in caplog.records if r.name == "treadle.events.printer"}
    return [r.getMessage() for r in records.values()]


def test_printer_line_with_eta_and_samples_per_second(treadle_caplog):
    printer = CommonMetricPrinter(max_iter=100, window_size=4, samples_per_iter=64, color=False)
    printer.set_start_iter(0)
    with EventStorage(0) as s:
        for it in range(20):
            s.iter = it
            put_training_scalars(s, it)
            s.put_scalar("data_time", 0.01, kind=ScalarKind.TIME)
            s.put_scalar("time", 0.5, kind=ScalarKind.TIME)
        printer.write()
    # eta: median time 0.5 s x 80 iterations left; samples/s: 64 / 0.5.
    assert printed(treadle_caplog) == [
        "eta: 0:00:40  iter: 19/100  total_loss: 17.5  loss_cls: 8.75  time: 0.5000  "
        "data_time: 0.0100  samples/s: 128  lr: 0.1"
    ]


def test_printer_without_time_lr_or_max_iter_prints_what_it_has(treadle_caplog):
    printer = CommonMetricPrinter(window_size=1, samples_per_iter=64, color=False)
    with EventStorage(0) as s:
        s.iter = 4
        s.put_scalar("total_loss", torch.tensor(2.0), kind=ScalarKind.LOSS)
        s.put_scalar("grad_norm", torch.tensor(3.0))
        printer.write()
    assert printed(treadle_caplog) == ["iter: 4  total_loss: 2  grad_norm: 3"]


def test_printer_eta_from_the_wall_clock_without_a_timer(treadle_caplog, monkeypatch):
    clock = iter([100.0, 110.0, 110.0, 130.0, 130.0])
    monkeypatch.setattr(printer_module, "_now", lambda: next(clock))
    printer = CommonMetricPrinter(max_iter=50, window_size=1, color=False)
    printer.set_start_iter(0)  # clock 100
    with EventStorage(0) as s:
        s.iter = 9
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        printer.write()  # 10 s for 10 iterations, 40 left
        s.iter = 19
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        printer.write()  # 20 s for 10 iterations, 30 left
    assert printed(treadle_caplog) == [
        "eta: 0:00:40  iter: 9/50  total_loss: 1",
        "eta: 0:01:00  iter: 19/50  total_loss: 1",
    ]


def test_printer_prints_evaluation_metrics_once_on_their_own_line(treadle_caplog):
    printer = CommonMetricPrinter(window_size=1, color=False)
    with EventStorage(0) as s:
        s.iter = 9
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        s.put_scalar("eval/acc", 0.25, smoothing_hint=False, kind=ScalarKind.METRIC)
        s.put_scalar("eval/top5", 0.875, smoothing_hint=False, kind=ScalarKind.METRIC)
        printer.write()
        printer.write()  # same iteration, nothing new
        s.put_scalar("eval/acc", 0.5, smoothing_hint=False, cur_iter=10, kind=ScalarKind.METRIC)  # e.g. a final evaluation
        printer.write()
    assert printed(treadle_caplog) == [
        "iter: 9  total_loss: 1",
        "metrics after 10 iterations:  eval/acc: 0.25  eval/top5: 0.875",
        "metrics after 10 iterations:  eval/acc: 0.5",  # put at 10 (detectron2: max_iter), after 10 too
    ]


def test_printer_does_not_print_a_resumed_runs_earlier_evaluation_again(treadle_caplog):
    # The first run of 60 iterations ended with an evaluation at 60 (its
    # max_iter); a resume at 60 restores it, and the console printed it as
    # this run's, after the first training line.
    printer = CommonMetricPrinter(window_size=1, color=False)
    with EventStorage(60) as s:
        s.restore_recent({"accuracy": {"points": [[0.25, 19], [0.5, 60]], "hint": False, "kind": ScalarKind.METRIC}})
        printer.set_start_iter(60)
        s.iter = 79
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        printer.write()
        s.put_scalar("accuracy", 0.75, smoothing_hint=False, kind=ScalarKind.METRIC)
        printer.write()
        # Evaluated again at an iteration already printed, with another value: news.
        s.put_scalar("accuracy", float("nan"), smoothing_hint=False, kind=ScalarKind.METRIC)
        printer.write()
        printer.write()  # and a NaN is not news twice
    assert printed(treadle_caplog) == [
        "iter: 79  total_loss: 1",
        "metrics after 80 iterations:  accuracy: 0.75",
        "metrics after 80 iterations:  accuracy: nan",
    ]


def test_printer_drops_a_loss_that_is_no_longer_put(treadle_caplog):
    printer = CommonMetricPrinter(window_size=1, color=False)
    with EventStorage(0) as s:
        s.put_scalars(total_loss=1.0, loss_warmup=0.5, kind=ScalarKind.LOSS)
        printer.write()
        s.iter = 1
        s.put_scalar("total_loss", 2.0, kind=ScalarKind.LOSS)
        printer.write()
    assert printed(treadle_caplog) == ["iter: 0  total_loss: 1  loss_warmup: 0.5", "iter: 1  total_loss: 2"]


def test_printer_builds_no_line_nobody_sees_and_resumes_when_logging_is_enabled(treadle_caplog, monkeypatch):
    # INFO off on its logger (logging not set up): no text is built, but the
    # lines and metrics it would have shown count as shown.
    printer = CommonMetricPrinter(window_size=1, color=False)
    built = []
    training_line = CommonMetricPrinter._training_line
    monkeypatch.setattr(
        CommonMetricPrinter, "_training_line", lambda self, *a: built.append(a[1]) or training_line(self, *a)
    )
    logger = logging.getLogger("treadle.events.printer")
    with EventStorage(0) as s:
        s.iter = 9
        s.put_scalar("total_loss", 1.0, kind=ScalarKind.LOSS)
        s.put_scalar("eval/acc", 0.25, smoothing_hint=False, kind=ScalarKind.METRIC)
        logger.setLevel(logging.WARNING)
        try:
            printer.write()
        finally:
            logger.setLevel(logging.NOTSET)
        assert built == [] and printed(treadle_caplog) == []
        s.iter = 19
        s.put_scalar("total_loss", 2.0, kind=ScalarKind.LOSS)
        printer.write()
    assert built == [19]
    assert printed(treadle_caplog) == ["iter: 19  total_loss: 2"]


def test_printer_colors_values_and_shows_cuda_memory(treadle_caplog, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 123 * 2**20)
    printer = CommonMetricPrinter(window_size=1, color=True)
    with EventStorage(0) as s:
        s.put_scalar("total_loss", 2.0, kind=ScalarKind.LOSS)
        printer.write()
    (line,) = printed(treadle_caplog)
    assert line.startswith("iter: \x1b[")  # label plain, value colored
    assert "max_mem: \x1b[1m\x1b[36m123M\x1b[0m" in line


def test_printer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="samples_per_iter must be a positive number"):
        CommonMetricPrinter(samples_per_iter=0)
    with pytest.raises(ValueError, match="max_iter must be a non-negative int"):
        CommonMetricPrinter(max_iter=1.5)


# -------------------------------------------------------------------- defaults


def test_get_default_writers(tmp_path):
    printer, json_writer, tb_writer = get_default_writers(str(tmp_path), max_iter=10, window_size=5)
    assert isinstance(printer, CommonMetricPrinter)
    assert isinstance(json_writer, JSONWriter) and json_writer.path == os.path.join(str(tmp_path), "metrics.json")
    assert json_writer.window_size == 5
    assert isinstance(tb_writer, TensorboardWriter) and tb_writer.log_dir == str(tmp_path)


def test_get_default_writers_is_empty_off_the_main_process(tmp_path, monkeypatch):
    monkeypatch.setattr(writers_module, "is_main_process", lambda: False)
    assert get_default_writers(str(tmp_path), max_iter=10) == []


def test_unsmoothed_training_scalars_are_written_once_per_write_at_their_latest_value(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with EventStorage(0) as s:
        for it in range(40):
            s.iter = it
            s.put_scalar("lr", 0.1 * (40 - it) / 40, smoothing_hint=False)
            s.put_scalar("total_loss", torch.tensor(float(it)), kind=ScalarKind.LOSS)
            if (it + 1) % 20 == 0:
                writer.write()
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [19, 39]
    assert lines[0]["lr"] == pytest.approx(0.1 * 21 / 40)  # the latest value, not a median
    assert lines[1]["total_loss"] == 29.5  # median of 20..39


def test_smoothing_windows_count_iterations_not_values(tmp_path):
    """detectron2's count_samples rule: a scalar put every 5 iterations is
    smoothed over the same 20 iterations as one put every iteration."""
    with EventStorage(0) as s:
        for it in range(40):
            s.iter = it
            s.put_scalar("every", float(it))
            if it % 5 == 4:
                s.put_scalar("sparse", float(it))
        assert s.count_samples("every", 20) == 20
        assert s.count_samples("sparse", 20) == 4  # 24, 29, 34, 39
        assert s.smoothed("sparse", 20) == 31.5
        assert s.latest_with_smoothing_hint(20)["sparse"] == (31.5, 39)


def test_json_lines_are_what_json_dumps_writes(tmp_path):
    """JSONWriter puts a line together from cached key encodings and each
    value's repr; it must be byte for byte what json.dumps writes."""
    import random

    writer = JSONWriter(str(tmp_path / "metrics.json"))
    names = ["total_loss", "lr", 'we"ird\\name', "é/acc", "a\nb", "\x00", "😀"]
    values = [-0.0, 0.0, float("nan"), float("inf"), -float("inf"), 1e308, 5e-324, 3, True, 10**20, 0.1 + 0.2]
    rng = random.Random(0)
    for _ in range(2000):
        scalars = {rng.choice(names): rng.choice(values + [rng.random() * 10 ** rng.randint(-30, 30)]) for _ in range(5)}
        it = rng.randint(0, 10**9)
        expected = {"iteration": it, **{n: (v if math.isfinite(v) else None) for n, v in sorted(scalars.items())}}
        assert writer._line(it, scalars) == json.dumps(expected) + "\n"


@pytest.mark.parametrize("writer_class", ["JSONWriter", "CSVWriter"])
def test_file_writers_hand_lines_over_at_most_flush_secs_apart_and_all_at_flush(tmp_path, monkeypatch, writer_class):
    from treadle.events import writer as writer_module

    now = [100.0]
    monkeypatch.setattr(writer_module.time, "monotonic", lambda: now[0])
    path = tmp_path / "metrics.out"
    writer = getattr(writers_module, writer_class)(str(path), flush_secs=5)

    def lines():
        return [line for line in path.read_text().splitlines() if not line.startswith("iteration")]

    with EventStorage(0) as storage:
        writer.set_start_iter(0)
        for it in range(4):
            storage.iter = it
            storage.put_scalar("loss", float(it), smoothing_hint=False)
            writer.write()
            now[0] += 1.0
        assert len(lines()) == 1  # the first write at once; the next three wait in the buffer
        storage.iter = 4
        storage.put_scalar("loss", 4.0, smoothing_hint=False)
        now[0] += 1.0  # 5 s after the first: this write hands everything over
        writer.write()
        assert len(lines()) == 5
        storage.iter = 5
        storage.put_scalar("loss", 5.0, smoothing_hint=False)
        writer.write()
        assert len(lines()) == 5
        writer.flush()  # what PeriodicWriter.flush does before a checkpoint
        assert len(lines()) == 6
    writer.close()
    with pytest.raises(ValueError, match="flush_secs"):
        getattr(writers_module, writer_class)(str(path), flush_secs=-1)


# -------------------------------------------------------------------- ranks


def _same_writers(tmp_path):
    return [
        CommonMetricPrinter(max_iter=10, color=False),
        JSONWriter(str(tmp_path / "metrics.json")),
        CSVWriter(str(tmp_path / "metrics.csv")),
        TensorboardWriter(str(tmp_path / "tb")),
    ]


def _train_and_write(writers, calls):
    """Iterations 0..9 with a write after each fifth, under a storage whose
    cross-rank reducer (here: one that only counts its calls) is a collective."""
    for w in writers:
        w.set_start_iter(0)
    with EventStorage(0) as s:
        s.reducer = lambda entries: calls.append(len(entries)) or [float(v) for _, v, _ in entries]
        for it in range(10):
            s.iter = it
            put_training_scalars(s, it)
            if it % 5 == 4:
                s.put_scalar("eval/acc", it / 100, smoothing_hint=False, kind=ScalarKind.METRIC)
                for w in writers:
                    w.write()
    for w in writers:
        w.close()


def test_writers_off_the_main_process_write_no_file_and_print_nothing(tmp_path, monkeypatch, treadle_caplog):
    (tmp_path / "metrics.json").write_text('{"iteration": 3}\n')  # the main process's file: left alone
    monkeypatch.setattr(comm, "get_rank", lambda: 1)
    rank1_calls: list = []
    _train_and_write(_same_writers(tmp_path), rank1_calls)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    assert (tmp_path / "metrics.json").read_text() == '{"iteration": 3}\n'
    assert printed(treadle_caplog) == []
    # The storage is read as on the main process: the reducer ran at the same writes.
    monkeypatch.setattr(comm, "get_rank", lambda: 0)
    main = tmp_path / "main"
    main_calls: list = []
    _train_and_write(_same_writers(main), main_calls)
    assert rank1_calls == main_calls == [16, 16]
    assert [row["iteration"] for row in read_json_lines(main / "metrics.json")] == [4, 9]
    assert len(printed(treadle_caplog)) == 4  # two training lines, two evaluation lines


def test_a_writer_meant_for_every_rank_writes_its_own_file_on_every_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(comm, "get_rank", lambda: 1)
    writer = JSONWriter(str(tmp_path / "metrics_rank1.json"))
    writer.every_rank = True
    _train_and_write([writer], [])
    assert [row["iteration"] for row in read_json_lines(tmp_path / "metrics_rank1.json")] == [4, 9]


def test_trackers_off_the_main_process_send_nothing(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from treadle.events.mlflow_writer import MLflowWriter
    from treadle.events.wandb_writer import WandbWriter

    monkeypatch.setattr(comm, "get_rank", lambda: 1)
    writers = [
        MLflowWriter(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment_name="e"),
        WandbWriter(project="p", mode="offline", dir=str(tmp_path)),
    ]
    _train_and_write(writers, [])
    assert list(tmp_path.iterdir()) == []
    assert [w.run_id for w in writers] == [None, None]

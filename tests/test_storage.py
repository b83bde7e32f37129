import math

import pytest
import torch

from treadle.events import EventStorage, HistoryBuffer, NonFiniteLossError, ScalarKind, get_event_storage


def test_get_event_storage_outside_context_is_a_clear_error():
    with pytest.raises(RuntimeError, match="outside of an EventStorage context"):
        get_event_storage()


def test_storage_stack_nests_and_unwinds():
    with EventStorage(0) as outer:
        assert get_event_storage() is outer
        with EventStorage(5) as inner:
            assert get_event_storage() is inner
            assert inner.iter == 5
        assert get_event_storage() is outer


def test_tensors_are_resolved_only_when_read():
    with EventStorage(0) as s:
        x = torch.tensor(1.5)
        s.put_scalar("loss", x)
        assert s._pending and s._pending[0][1] is not x  # detached view kept, not read
        s.put_scalar("n", 3)
        assert s.latest() == {"loss": (1.5, 0), "n": (3.0, 0)}
        assert not s._pending


def test_values_keep_put_order_and_iterations():
    with EventStorage(0) as s:
        for it in range(4):
            s.iter = it
            s.put_scalar("a", torch.tensor(float(it)))
            s.put_scalar("a2", it * 2.0)
        assert s.history("a").values() == [(0.0, 0), (1.0, 1), (2.0, 2), (3.0, 3)]
        assert s.history("a2").latest() == 6.0


def test_latest_with_smoothing_hint_takes_the_window_median():
    with EventStorage(0) as s:
        for it, v in enumerate([1.0, 100.0, 3.0, 4.0, 5.0]):
            s.iter = it
            s.put_scalar("loss", torch.tensor(v))
            s.put_scalar("acc", v, smoothing_hint=False)
        smoothed = s.latest_with_smoothing_hint(window_size=3)
        assert smoothed["loss"] == (4.0, 4)  # median of 3, 4, 5
        assert smoothed["acc"] == (5.0, 4)


def test_smoothing_hint_cannot_change_for_a_name():
    with EventStorage(0) as s:
        s.put_scalar("x", 1.0)
        with pytest.raises(ValueError, match="'x' was put with smoothing_hint=True"):
            s.put_scalar("x", 1.0, smoothing_hint=False)


def test_non_scalar_tensor_is_rejected_with_its_shape():
    with EventStorage(0) as s:
        with pytest.raises(ValueError, match=r"'v' must have one element, got a tensor of shape \(2,\)"):
            s.put_scalar("v", torch.ones(2))


def test_name_scope_prefixes_and_restores():
    with EventStorage(0) as s:
        with s.name_scope("eval"):
            s.put_scalar("acc", 0.5)
            with s.name_scope("val/"):
                s.put_scalar("acc", 0.7)
        s.put_scalar("acc", 0.1)
        assert set(s.latest()) == {"eval/acc", "eval/val/acc", "acc"}


def test_put_scalars_and_unknown_history_name():
    with EventStorage(0) as s:
        s.put_scalars(a=1, b=torch.tensor(2.0), kind=ScalarKind.METRIC)
        assert s.kind("a") == ScalarKind.METRIC
        with pytest.raises(KeyError, match=r"No scalar named 'c'.*\['a', 'b'\]"):
            s.history("c")


def test_non_finite_loss_names_first_iteration_and_every_term():
    with EventStorage(0) as s:
        for it in range(6):
            s.iter = it
            bad = it >= 3
            s.put_scalar("loss_cls", torch.tensor(float("nan") if bad else 1.0), kind=ScalarKind.LOSS)
            s.put_scalar("loss_box", torch.tensor(0.25), kind=ScalarKind.LOSS)
            s.put_scalar("lr", float("nan"))  # not a loss: not checked
        with pytest.raises(NonFiniteLossError) as info:
            s.latest()
        assert info.value.iteration == 3
        assert set(info.value.terms) == {"loss_cls", "loss_box"}
        assert "iteration 3" in str(info.value) and "loss_cls=nan" in str(info.value) and "loss_box=0.25" in str(info.value)
        # The values were recorded, so writers can still show them.
        assert math.isnan(s.history("loss_cls").latest())


def test_non_finite_check_can_be_disabled():
    with EventStorage(0, nonfinite_check="off") as s:
        s.put_scalar("loss", torch.tensor(float("inf")), kind=ScalarKind.LOSS)
        assert s.latest()["loss"][0] == float("inf")
    with pytest.raises(ValueError, match="nonfinite_check"):
        EventStorage(0, nonfinite_check="sometimes")


def test_pending_values_are_bounded():
    with EventStorage(0, max_pending=10) as s:
        for i in range(25):
            s.put_scalar("x", torch.tensor(float(i)))
        assert len(s._pending) < 10
        assert s.history("x").latest() == 24.0


def test_history_buffer_is_bounded_and_keeps_the_global_average():
    h = HistoryBuffer(max_length=3)
    for i in range(10):
        h.update(float(i), i)
    assert h.values() == [(7.0, 7), (8.0, 8), (9.0, 9)]
    assert h.global_avg() == pytest.approx(4.5)
    assert h.median(2) == 8.5
    assert h.avg(3) == 8.0
    assert h.values_after(7) == [(8.0, 8), (9.0, 9)]
    assert h.values_after(9) == []


def test_images_and_histograms_are_queued_with_their_iteration():
    with EventStorage(3) as s:
        w = torch.ones(4)
        s.put_image("img", torch.zeros(3, 2, 2))
        s.put_histogram("w", w)
        w.add_(1)  # the histogram keeps the values at the time of the put
        assert s.images[0][0] == "img" and s.images[0][2] == 3
        assert torch.equal(s.histograms[0][1], torch.ones(4))
        s.clear_images()
        s.clear_histograms()
        assert s.images == [] and s.histograms == []

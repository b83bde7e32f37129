import math

import pytest
import torch

from treadle.events import EventStorage, HistoryBuffer, NonFiniteLossError, ScalarKind, get_event_storage
from treadle.events import storage as storage_module


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
        assert s._pending["loss"][0][0] is x  # kept as it is, not read
        w = torch.tensor(2.0, requires_grad=True)
        s.put_scalar("w", w * 1)
        kept = s._pending["w"][0][0]
        assert not kept.requires_grad and kept.grad_fn is None  # no autograd graph kept alive
        s.put_scalar("n", 3)
        assert s.latest() == {"loss": (1.5, 0), "w": (2.0, 0), "n": (3.0, 0)}
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


def test_value_over_iterations_is_the_mean_without_nan_and_the_last_of_a_value_read_as_it_is():
    """What an epoch's row of the history holds and what a BestCheckpointer or EarlyStopping watching a
    training scalar every N iterations reads: one rule."""
    with EventStorage(0) as s:
        for it, v in enumerate([1.0, 2.0, math.nan, 6.0, 10.0]):
            s.iter = it
            s.put_scalar("total_loss", torch.tensor(v))
            s.put_scalar("lr", 0.1 * (it + 1), smoothing_hint=False)
        assert s.value_over("total_loss", 0, 3) == 3.0  # (1 + 2 + 6) / 3: the NaN left out
        assert s.value_over("total_loss", 4, 4) == 10.0
        assert s.value_over("total_loss", 2, 2) is None
        assert s.value_over("lr", 0, 3) == pytest.approx(0.4)  # the epoch's last rate, not a mean


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
        assert sum(len(points) for points in s._pending.values()) < 10
        assert s.history("x").latest() == 24.0


def test_pending_cpu_tensors_have_their_own_lower_bound():
    """CPU values are read without a device sync; each pending one is a small
    allocation that outlives its step, so fewer of them wait for a flush."""
    with EventStorage(0, max_pending_cpu=5) as s:
        assert (s.max_pending, s.max_pending_cpu) == (100_000, 5)
        for i in range(12):
            s.iter = i
            s.put_scalar("x", torch.tensor(float(i)))
            assert sum(len(points) for points in s._pending.values()) < 5
        assert s.history("x").values() == [(float(i), i) for i in range(12)]


def test_pending_cpu_tensors_wait_for_the_flush_while_a_device_tensor_is_pending():
    """Resolving would read the device tensor too: a sync a GPU run makes only
    at a flush. A meta tensor stands for it (reading it raises)."""
    with EventStorage(0, max_pending_cpu=5) as s:
        s.put_scalar("on_device", torch.tensor(1.0, device="meta"))
        for i in range(12):
            s.put_scalar("x", torch.tensor(float(i)))
        assert len(s._pending["x"]) == 12
    with EventStorage(0, max_pending_cpu=5) as s:
        s.open_series("device_loss").append((torch.tensor(1.0, device="meta"), 0))
        looks = []
        only_host = s._only_host_tensors_pending
        s._only_host_tensors_pending = lambda: looks.append(1) or only_host()
        for i in range(12):
            s.put_scalar("x", torch.tensor(float(i)))
        assert len(s._pending["x"]) == 12
        assert len(looks) == 2  # at the 5th and 10th put, not at every put after the 5th


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


@pytest.mark.parametrize("one_by_one", [True, False], ids=["cpu-reads", "batched-reads"])
def test_mixed_dtypes_and_numbers_resolve_exactly_in_put_order(monkeypatch, one_by_one):
    # The batched path is what tensors on an accelerator take; forced here on the CPU.
    monkeypatch.setattr(storage_module, "_READ_CPU_TENSORS_ONE_BY_ONE", one_by_one)
    with EventStorage(0) as s:
        for it in range(3):
            s.iter = it
            s.put_scalar("f32", torch.tensor(0.1 + it, dtype=torch.float32))
            s.put_scalar("f64", torch.tensor(1 / 3 + it, dtype=torch.float64))
            s.put_scalar("bf16", torch.tensor(1.5 + it, dtype=torch.bfloat16))
            s.put_scalar("i64", torch.tensor(7 + it))
            s.put_scalar("mixed", torch.tensor(float(it)) if it % 2 else it * 10)
        assert s.history("f32").values() == [(torch.tensor(0.1 + i, dtype=torch.float32).item(), i) for i in range(3)]
        assert s.history("f64").values() == [(1 / 3 + i, i) for i in range(3)]  # no rounding through float32
        assert s.history("bf16").values() == [(1.5 + i, i) for i in range(3)]
        assert s.history("i64").values() == [(7.0 + i, i) for i in range(3)]
        assert s.history("mixed").values() == [(0.0, 0), (1.0, 1), (20.0, 2)]
        assert all(type(v) is float for name in ("f32", "i64", "mixed") for v, _ in s.history(name).values())


def test_batched_reads_take_one_element_tensors_of_any_shape(monkeypatch):
    # () and (1,) on one device and dtype are stacked together on the batched path.
    monkeypatch.setattr(storage_module, "_READ_CPU_TENSORS_ONE_BY_ONE", False)
    with EventStorage(0) as s:
        s.put_scalar("a", torch.tensor(1.5))
        s.put_scalar("b", torch.tensor([2.5]))
        s.put_scalar("c", torch.tensor([[3.5]]))
        s.put_scalar("a", torch.tensor([4.5]), cur_iter=1)
        assert s.history("a").values() == [(1.5, 0), (4.5, 1)]
        assert s.latest() == {"a": (4.5, 1), "b": (2.5, 0), "c": (3.5, 0)}


def test_values_stay_pending_when_resolving_fails():
    def failing_reducer(entries):
        raise RuntimeError("reducer failed")

    with EventStorage(0) as s:
        s.put_scalar("loss", torch.tensor(0.5), kind=ScalarKind.LOSS)
        s.put_scalar("lr", 0.1)
        s.iter = 1
        s.put_scalar("loss", torch.tensor(0.25), kind=ScalarKind.LOSS)
        s.reducer = failing_reducer
        with pytest.raises(RuntimeError, match="reducer failed"):
            s.latest()
        s.reducer = None
        # Nothing of the failed period was lost.
        assert s.history("loss").values() == [(0.5, 0), (0.25, 1)]
        assert s.history("lr").values() == [(0.1, 0)]
        assert not s._pending and not s._tensor_names and s._pending_tensors == 0


def test_history_extend_equals_updates_and_median_handles_non_finite_values():
    one, batch = HistoryBuffer(4), HistoryBuffer(4)
    points = [(3.0, 0), (1.0, 1), (4.0, 2), (1.5, 3), (9.0, 4), (2.0, 5)]
    for v, it in points:
        one.update(v, it)
    batch.extend(points[:2])
    batch.extend(points[2:])
    assert batch.values() == one.values() == points[2:]
    assert batch.global_avg() == pytest.approx(one.global_avg()) == pytest.approx(20.5 / 6)
    assert batch.median(3) == 2.0 and batch.median(4) == 3.0  # odd and even windows
    h = HistoryBuffer()
    h.extend([(1.0, 0), (float("inf"), 1), (float("-inf"), 2)])
    assert h.median(3) == 1.0
    h.update(float("nan"), 3)
    assert math.isnan(h.median(4))
    h.extend([(5.0, 4), (6.0, 5)])
    assert h.median(2) == 5.5  # the NaN left the window


def test_history_counts_recent_values_from_the_newest_end():
    from treadle.events import HistoryBuffer

    history = HistoryBuffer(max_length=5)
    assert history.latest_iteration() is None and history.count_after(-1) == 0
    for it in (0, 5, 10, 15, 20, 25, 30):  # the two oldest are evicted
        history.update(float(it), it)
    assert history.latest_iteration() == 30
    assert history.count_after(14) == 4  # 15, 20, 25, 30
    assert history.count_after(30) == 0
    assert history.count_after(-100) == 5  # only what is kept

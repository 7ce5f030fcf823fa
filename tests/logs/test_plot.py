"""Plot layout decisions (which panels, which labels) and that a plot with every mark is written."""
from pathlib import Path

from mftk.logs.plot import PlotRun, draw_runs, panels_for, plot_runs, short_labels
from tests.helpers.logsynth import step_metrics


def _series(n=20, **extra):
    return [dict(step_metrics(s), **extra) for s in range(1, n + 1)]


def test_main_loss_has_its_own_panel():
    rows = [dict(r, mtp_1_loss=r["loss"] / 10) for r in _series()]
    titles = {p.title: p.fields for p in panels_for([PlotRun("a", rows)], None, None)}
    assert titles["loss"] == ("loss",)
    assert titles["auxiliary losses"] == ("load_balancing_loss", "mtp_1_loss")


def test_throughput_in_a_unit_that_shows_it():
    """Exact sub-TFLOP/s rates are drawn in GFLOP/s; the step line's rounded 0.00T gives way to tokens/s."""
    gflops = panels_for([PlotRun("a", _series(throughput=0.0041))], None, None)
    assert "throughput (GFLOP/s/device)" in [p.title for p in gflops]
    rounded = panels_for([PlotRun("a", _series(throughput=0.0))], None, 128)
    panel = next(p for p in rounded if p.title == "tokens/s")
    record = _series(throughput=0.0)[3]
    assert panel.value(record, "rate") == record["global_batch_size"] * 128 / record["per_step_time"] * 1000


def test_compare_legends_name_what_differs():
    assert short_labels(["runs/a/log/rank_0/info.log", "runs/b/log/rank_0/info.log"]) == ["a", "b"]
    assert short_labels(["x.log", "y.log"]) == ["x.log", "y.log"]
    assert short_labels(["same/info.log", "same/info.log"]) == ["1: info.log", "2: info.log"]
    assert short_labels(["only/one.log"]) == ["only/one.log"]


def test_plot_with_resume_and_bad_steps_is_written(tmp_path: Path):
    rows = _series(30)
    out = plot_runs([PlotRun("runs/a/info.log", rows, bad_steps=[12], resume_steps=[20]),
                     PlotRun("runs/b/info.log", rows)], tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_restarts_are_marked_at_their_resumed_step(tmp_path: Path):
    """Each `--max-restarts` relaunch read back from a job's logs is a vertical line on every panel at the step it
    resumed from, named on the loss panel; duplicates from other ranks' logs are drawn once."""
    import matplotlib.pyplot as plt

    from mftk.logs.restarts import Restart, plot_marks, read_restarts, write_restart

    logs = [tmp_path / "rank_0", tmp_path / "rank_1"]
    for d in logs:
        d.mkdir()
    for attempt, (reason, reached, resumed) in enumerate([("died", 7, 4), ("hang", 13, 12)], start=1):
        write_restart(Restart(attempt=attempt, max_restarts=3, reason=reason, ranks=(1,), step_reached=reached,
                              resumed_from=f"ckpt/iteration_{resumed:08d}", resumed_step=resumed,
                              steps_lost=reached - resumed, seconds_lost=2.0, message="m"), logs)
    marks = plot_marks(read_restarts([d / "info.log" for d in logs]))
    assert marks == [(4, "restart #1 (died)"), (12, "restart #2 (hang)")]
    (logs[1] / "metrics.jsonl").unlink()  # an info.log alone: its WARNING lines give the same marks
    assert plot_marks(read_restarts([logs[1] / "info.log"])) == marks

    fig = draw_runs([PlotRun("a", _series(20), restarts=marks)])
    try:
        for ax in fig.axes:
            dashdot = [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "-."]
            assert dashdot == [4, 12]
        texts = [t.get_text().strip() for t in fig.axes[0].texts]
        assert texts == ["restart #1 (died)", "restart #2 (hang)"]
        assert all(not ax.texts for ax in fig.axes[1:])
    finally:
        plt.close(fig)

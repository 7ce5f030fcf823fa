"""`mftk parse-log` through the CLI: exit codes, stdout vs stderr."""
import json

import pytest
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.logsynth import SEED_LINES, synth_lines



@pytest.fixture
def logdir(tmp_path):
    d = tmp_path / "msrun_log"
    d.mkdir()
    for rank in range(2):
        (d / f"worker_{rank}.log").write_text("\n".join(synth_lines(40, nan_at=(25,))) + "\n")
    return d


def test_table_and_summary(logdir):
    result = runner.invoke(app, ["parse-log", str(logdir), "--peak-tflops", "100"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "summary" in out and "ranks 0,1" in out and "MFU" in out and "25.0% of 100 TFLOP/s" in out
    assert "loss is NaN" in out and "anomalies (2)" in out


def test_seed_lines(tmp_path):
    path = tmp_path / "worker_0.log"
    path.write_text("\n".join(SEED_LINES) + "\n")
    result = runner.invoke(app, ["parse-log", str(path), "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [s["loss"] for s in data["steps"]] == [11.813965, 11.755612]
    assert data["summary"]["throughput_tflops"] == 25.92  # step 1 is warm-up


def test_fail_on_exits_3_after_printing(logdir, tmp_path):
    out = tmp_path / "a.json"
    result = runner.invoke(app, ["parse-log", str(logdir), "--fail-on", "nan", "--json", str(out)])
    assert result.exit_code == 3
    assert "anomalies found: nan (steps 25)" in result.stderr and "summary" in result.stdout
    assert json.loads(out.read_text())["anomalies"][0]["ranks"] == [0, 1]
    ok = runner.invoke(app, ["parse-log", str(logdir), "--fail-on", "spike,resume"])
    assert ok.exit_code == 0


def test_plot_and_csv(logdir, tmp_path):
    png, csv_out = tmp_path / "p.png", tmp_path / "s.csv"
    result = runner.invoke(app, ["parse-log", str(logdir), "--plot", str(png), "--csv", str(csv_out)])
    assert result.exit_code == 0, result.output
    assert png.stat().st_size > 0 and f"wrote {png}" in result.stderr
    assert len(csv_out.read_text().splitlines()) == 1 + 80  # two ranks x 40 steps


@pytest.mark.parametrize("content,code,message", [
    (None, 2, "log not found"),
    (b"", 1, "is empty"),
    (b"\x00\x01binary", 1, "binary file"),
    (b"hello\nworld\n", 1, "no training step lines found"),
])
def test_bad_input_clear_message_no_traceback(tmp_path, content, code, message):
    path = tmp_path / "x.log"
    if content is not None:
        path.write_bytes(content)
    result = runner.invoke(app, ["parse-log", str(path)])
    assert result.exit_code == code
    assert message in result.stderr and "Traceback" not in result.output
    assert result.stdout == ""


def test_follow_is_bounded_and_prints_when_piped(logdir):
    """Not a terminal: every step is printed as one plain line as it is read (like tail -f), then the summary."""
    result = runner.invoke(app, ["parse-log", str(logdir / "worker_0.log"), "--follow", "--follow-updates", "1",
                                 "--poll", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["step", "consumed_samples", "loss"]
    assert [line.split()[0] for line in lines[1:41]] == [str(n) for n in range(1, 41)]
    assert "summary" in result.stdout

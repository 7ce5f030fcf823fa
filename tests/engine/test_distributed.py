"""Worker results (no processes); the checkpoint metadata and the norm weights are tested with the placement
table (tests/engine/parallel/test_placement.py)."""
from __future__ import annotations


def test_worker_result_round_trips_through_json():
    import json

    import attrs

    from mftk.ckpt.resume import ResumePlan
    from mftk.engine.run import TrainResult
    from mftk.engine.workers import result_from_json

    plan = ResumePlan(source="s", kind="mf", step_dir="d", scenario=1, saved_step=2, saved_global_batch_size=4,
                      global_batch_size=4, saved_world=2, world=1, start_step=2, consumed_samples=8,
                      skip_micro_batches=8, loads=("model weights",), notes=("n",))
    r = TrainResult(start_step=2, final_step=4, total_steps=4, consumed_samples=16, losses=(1.5, 1.25),
                    grad_norms=(0.5, None), skipped_steps=0, checkpoint="c", output_dir="o", log_file="l",
                    metrics_file="m", phases=(("model build", 0.1),), resume=plan, parameters=(623, 600))
    assert result_from_json(json.loads(json.dumps(attrs.asdict(r)))) == r
